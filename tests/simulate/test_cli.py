import json

from radixmesh import cli as radixmesh_cli
from radixmesh.simulate.cli import POLICY_ORDER, main


def test_quick_run_prints_a_row_per_policy_and_writes_json(tmp_path, capsys):
    out = tmp_path / "sim.json"
    assert main(["--quick", "--workers", "8", "--requests", "80", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "8 workers, 80 requests" in text and "req/s" in text
    for policy in POLICY_ORDER:
        assert f"| {policy} |" in text
    data = json.loads(out.read_text())
    assert data["setup"]["trace"]["workers"] == 8 and len(data["results"]) == 5


def test_radixmesh_simulate_subcommand(capsys):
    argv = ["simulate", "--quick", "--workers", "4", "--requests", "30",
            "--policies", "round_robin"]
    assert radixmesh_cli.main(argv) == 0
    assert "| round_robin |" in capsys.readouterr().out


def test_bad_arguments_exit_2(capsys):
    assert main(["--quick", "--policies", "cache_aware,nope"]) == 2
    assert "unknown policies ['nope']" in capsys.readouterr().err
    assert main(["--quick", "--workers", "2", "--kv-slots", "512"]) == 2
