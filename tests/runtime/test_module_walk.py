"""Module.walk: the one traversal of a module tree (DFS pre-order, import order, each once)."""

from __future__ import annotations

from kiln.runtime import blob
from kiln.runtime.module import Module


class _Named(Module):
    def __init__(self, name: str, dso: bool = False) -> None:
        super().__init__()
        self.name, self._dso = name, dso

    @property
    def is_dso_exportable(self) -> bool:
        return self._dso

    def _get_local_function(self, name):
        return (lambda: self.name) if name == f"f_{self.name}" else None


def _tree() -> dict[str, _Named]:
    #   r -> a -> c
    #     \-> b -> c (shared), b -> r (cycle)
    m = {k: _Named(k) for k in "rabc"}
    m["r"].import_module(m["a"])
    m["r"].import_module(m["b"])
    m["a"].import_module(m["c"])
    m["b"].import_module(m["c"])
    m["b"].import_module(m["r"])
    return m


def test_walk_is_dfs_preorder_each_module_once():
    m = _tree()
    assert [x.name for x in m["r"].walk()] == ["r", "a", "c", "b"]
    assert [x.name for x in m["b"].walk()] == ["b", "c", "r", "a"]


def test_walk_follow_prunes_subtrees():
    m = _tree()
    assert [x.name for x in m["r"].walk(follow=lambda c: c.name != "a")] == ["r", "b", "c"]
    assert [x.name for x in m["r"].walk(follow=lambda c: False)] == ["r"]


def test_query_imports_searches_in_walk_order():
    m = _tree()
    assert m["r"].get_function("f_c", query_imports=True)() == "c"
    assert not m["a"].implements_function("f_b", query_imports=True)


def test_blob_dso_groups_follow_dso_imports_only():
    # r(dso) -> x(not dso) -> y(dso); r -> z(dso): {r, z} are one library, y gets its own group.
    r, x, y, z = _Named("r", True), _Named("x"), _Named("y", True), _Named("z", True)
    r.import_module(x)
    x.import_module(y)
    r.import_module(z)
    g = blob.group_modules(r)
    assert [[m.name for m in grp] for grp in g.groups] == [["r", "z"], ["x"], ["y"]]
    assert g.is_dso == [True, False, True]
    assert g.row_ptr == [0, 1, 2, 2] and g.child_indices == [1, 2]
