import pytest

from radixmesh.bench.tokens import common_prefix, ideal_hit_rate, trie_size


def test_trie_size_counts_each_shared_prefix_once():
    seqs = [[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 9], [7]]
    assert trie_size(seqs) == 4 + 1 + 1 + 1
    assert trie_size([[1, 2], [1, 2]]) == 2
    assert trie_size([]) == 0
    assert ideal_hit_rate(seqs) == pytest.approx(1 - 7 / 12)
    assert ideal_hit_rate([]) == 0.0


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix([], [1]) == 0


def test_prompt_text_encodes_to_the_templated_ids(chat_tok):
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "What is a handbook?"}]
    text = chat_tok.prompt(messages)
    assert text.endswith("assistant\n")
    assert chat_tok.text_ids(text) == chat_tok.prompt_ids(messages)
