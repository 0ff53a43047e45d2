"""The harness's one error type: a run that cannot go on as asked (exit status 2)."""


class BenchError(RuntimeError):
    pass
