"""The radix tree's invariants, checked (tests and debugging; O(nodes))."""

from __future__ import annotations

from libs.protocol.hashing import block_hashes


def check_tree(tree) -> None:
    """Raise AssertionError if sizes, locks, tiers, alignment or hashes disagree in
    ``tree`` (a RadixCache; not imported here, it imports this module)."""
    page = tree.page_size
    evictable = protected = 0
    for node in tree.nodes():
        assert node.on_device or node.lower is not None, "a node with its KV nowhere"
        assert node.parent.is_root or node.parent.on_device or not node.on_device
        for held in (node.value, node.lower):
            assert held is None or len(held) == len(node.key) > 0
        assert len(node.key) % page == 0
        assert len(node.hashes) == len(node.key) // page
        assert node.hashes == block_hashes(node.key, page, parent=node.parent.last_hash)
        locked_children = sum(c.lock_ref for c in node.children.values())
        assert node.lock_ref >= locked_children >= 0
        for first, child in node.children.items():
            assert child.parent is node and tuple(child.key[:page]) == first
        if node.lock_ref:
            assert node.on_device, "a locked node off the device"
            protected += len(node.key)
        elif node.on_device:
            evictable += len(node.key)
    assert (evictable, protected) == tuple(tree.size_info()), (
        (evictable, protected), tree.size_info())
