"""The liveness-based storage planner on small hand-written call sequences."""

from __future__ import annotations

from kiln.transform.memory_plan import PlanOp, plan_memory


def test_chain_reuses_two_buffers() -> None:
    # x(0) -> e1 -> e2 -> e3 -> e4 (output); 100 bytes each
    ops = [PlanOp((0,), (1,)), PlanOp((1,), (2,)), PlanOp((2,), (3,)), PlanOp((3,), (4,))]
    p = plan_memory([100] * 5, ops, fixed=[0], outputs=[4])
    sid = p.storage_ids
    assert sid[1] == sid[3] and sid[2] == sid[4] and sid[1] != sid[2]
    assert sid[0] not in sid[1:]
    assert p.planned_bytes == 200 and p.no_reuse_bytes == 400 and p.fixed_bytes == 100
    assert 0 < p.saved_fraction < 1 and "planned" in p.summary()


def test_output_never_overwritten_and_inputs_not_reused() -> None:
    # e1 = f(x); e2 = g(e1) [output]; e3 = h(e1); e4 = k(e3)
    ops = [PlanOp((0,), (1,)), PlanOp((1,), (2,)), PlanOp((1,), (3,)), PlanOp((3,), (4,))]
    p = plan_memory([10] * 5, ops, fixed=[0], outputs=[2, 4])
    sid = p.storage_ids
    assert len({sid[0], sid[1], sid[2]}) == 3
    assert sid[3] not in (sid[0], sid[1], sid[2])  # e1 still live while e3 is written
    assert sid[4] not in (sid[0], sid[2], sid[3])
    assert sid[4] == sid[1]  # e1 is dead by then


def test_best_fit_and_grow() -> None:
    # two dead buffers of 100 and 40 bytes; a 30-byte entry takes the 40, a 150 one grows the 100
    ops = [PlanOp((0,), (1,)), PlanOp((0,), (2,)), PlanOp((1, 2), (3,)),
           PlanOp((3,), (4,)), PlanOp((3,), (5,)), PlanOp((4, 5), (6,))]
    sizes = [8, 100, 40, 8, 30, 150, 8]
    p = plan_memory(sizes, ops, fixed=[0], outputs=[6])
    sid = p.storage_ids
    assert sid[4] == sid[2] and sid[5] == sid[1]
    assert p.storage_sizes[sid[1]] == 150


def test_nop_alias_shares_and_extends_lifetime() -> None:
    # e1 = f(x); e2 = nop(e1); e3 = g(e2); e4 = h(e3)
    ops = [PlanOp((0,), (1,)), PlanOp((1,), (2,), is_nop=True), PlanOp((2,), (3,)),
           PlanOp((3,), (4,))]
    p = plan_memory([16] * 5, ops, fixed=[0], outputs=[4])
    sid = p.storage_ids
    assert sid[2] == sid[1]
    assert sid[3] != sid[1]  # the alias is read while e3 is written
    assert sid[4] == sid[1]  # freed after the alias's last reader
    assert p.no_reuse_bytes == 48


def test_params_are_dedicated_and_unused_entries_get_ids() -> None:
    ops = [PlanOp((0, 1), (3,)), PlanOp((3, 1), (4,))]
    p = plan_memory([4, 4, 4, 4, 4], ops, fixed=[0, 1, 2], outputs=[4])
    sid = p.storage_ids
    assert len(set(sid[:3])) == 3 and not set(sid[3:]) & set(sid[:3])
    assert all(s >= 0 for s in sid)


def test_unread_extra_output_is_freed() -> None:
    # a two-output call whose second output nobody reads
    ops = [PlanOp((0,), (1, 2)), PlanOp((1,), (3,)), PlanOp((3,), (4,))]
    p = plan_memory([8] * 5, ops, fixed=[0], outputs=[4])
    assert p.storage_ids[3] == p.storage_ids[2]
