"""The step DAG of a pipeline schedule's per-rank step lists (cost/pipeline_sim.py's replay,
without times): `compile_dag` numbers the steps in the order the replay's sweep runs them.

The sweep (the replay of pipeline_sim's module docstring): over and over, rank 0, 1, ..., p-1
in turn runs the steps of its list, in order, while each one's inputs are done (pipeline_sim
`dependencies`: F needs the previous stage's F, I / B its own F and the next stage's input
gradient, any other kind its own I; an input gradient is made by the I or the B of its
(stage, micro-batch), pipeline_sim `produces`), and stops at the first one that waits; a
sweep in which no rank moves is a deadlock. Each step is numbered when it runs.

How it is computed fast (the same numbering, every field the same, tests/cost/
test_step_dag.py against the plain sweep over action tuples): every action's inputs and output
are integer tokens (F or I of a (stage, micro-batch)) computed with numpy, and each token has
one producing step, known before the sweep (a list where one token is made twice, i.e. an
action run twice, is rejected: no schedule does it). A step waits until each of its
inputs' producing steps has run, which is the plain sweep's test (a token is done once its
one producer has run), so the sweep runs the same steps in the same order; it reads one
integer per input instead of building and hashing action tuples. The fields are then read
off the numbering with numpy: a step's predecessors are its rank's previous step and, in
the order of `dependencies` over its actions, each input's producer, as the plain sweep
records them.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import itemgetter

import numpy as np
import numpy.typing as npt

Action = tuple[str, int, int]  # (kind F/I/W/B, stage, micro-batch)
Step = Action | tuple[str, Action, Action]  # or ("FB", forward action, backward action)

_KIND = {"F": 0, "I": 1, "B": 2}  # any other kind (W) is 3
_NONE = -2  # an empty slot of the integer tables below

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Dag:
    """The steps of every rank's list in the order the replay runs them (a topological
    order: each after its rank's previous step and the steps producing its inputs), the
    durations left out: which steps can run next depends on what is done, not when.
    `preds` and `kidx`, which only the replay of negative durations reads, are made from
    integer tables on first use."""

    rank: tuple[int, ...]  # each step's rank
    parts: tuple[tuple[Action, ...], ...]  # its actions (`step_actions`)
    first: tuple[bool, ...]  # whether it is its rank's first step
    last: tuple[int, ...]  # each rank's last step (-1: none)
    uniq: tuple[tuple[str, int], ...]  # the distinct (kind, stage) of all steps
    shapes: tuple[tuple[int, ...], ...]  # the distinct `kidx` entries
    shape: tuple[int, ...]  # each step's index into `shapes`
    # `_ends`' predecessor slots, steps numbered from 1 (0: none, an end of 0.0): slot 0 the
    # rank's previous step, the others the inputs on other ranks. An input on the step's own
    # rank is dropped: it ran before the rank's previous step, which ends no earlier when no
    # duration is negative (each end >= its start >= the rank's previous end), so it never
    # sets the start (`_ends` replays only such durations)
    slots: tuple[tuple[int, ...], ...]
    pred_table: IntArray = field(compare=False, repr=False)  # `preds`, _NONE-padded rows
    kidx_table: IntArray = field(compare=False, repr=False)  # `kidx`, _NONE-padded rows

    @functools.cached_property
    def preds(self) -> tuple[tuple[int, ...], ...]:
        """Each step's rank's previous step (if any), then its inputs' producing steps."""
        return _rows(self.pred_table)

    @functools.cached_property
    def kidx(self) -> tuple[tuple[int, ...], ...]:
        """Each step's actions as indices into `uniq`."""
        return _rows(self.kidx_table)

    @functools.cached_property
    def levels(self) -> tuple[tuple[IntArray, ...], ...]:
        """The steps by depth, each level as (its steps, numbered from 1 as in `slots`; then
        each slot's entries for them; then their `shape`s): a step's depth is 1 + the
        largest of its slots' (0 for slot 0, none), so every step's slots sit in earlier
        levels and a level's steps can be replayed together; in step order within one."""
        depth = [0] * (len(self.rank) + 1)
        if len(self.slots) == 2:
            for n, (a, b) in enumerate(zip(*self.slots, strict=True), 1):
                x, y = depth[a], depth[b]
                depth[n] = (x if x > y else y) + 1
        else:
            for n, row in enumerate(zip(*self.slots, strict=True), 1):
                depth[n] = max(depth[x] for x in row) + 1
        d = np.array(depth[1:], np.int64)
        if not len(d):
            return ()
        order = np.argsort(d, kind="stable")
        cuts = np.searchsorted(d[order], np.arange(2, int(d.max()) + 1))
        cols = [np.array(s, np.int64)[order] for s in self.slots]
        cols.append(np.array(self.shape, np.int64)[order])
        return tuple(zip(np.split(order + 1, cuts),
                         *(np.split(c, cuts) for c in cols), strict=True))


def _deadlock() -> ValueError:
    return ValueError("pipeline schedule deadlocks: an action waits on one never run")


def compile_dag(orders: Sequence[Sequence[Step]], stages: int) -> Dag:
    """The `Dag` of these step lists (module docstring: the sweep's numbering)."""
    lens = [len(o) for o in orders]
    steps: list[Step] = [st for o in orders for st in o]
    n = len(steps)
    parts: list[tuple[Action, ...]] = [
        (st[1], st[2]) if st[0] == "FB" else (st,) for st in steps]  # type: ignore[misc]
    if n == 0:
        empty = np.zeros((0, 1), np.int64)
        return Dag((), (), (), (-1,) * len(orders), (), (), (), ((),), empty, empty)
    width = np.fromiter(map(len, parts), np.int64, n)  # 1 or 2 actions per step
    acts = [a for ps in parts for a in ps]
    kinds = list(map(itemgetter(0), acts))
    names = list(dict.fromkeys(kinds))  # the kind letters, in order of first appearance
    code = np.fromiter(map({k: j for j, k in enumerate(names)}.__getitem__, kinds), np.int64,
                       len(acts))
    kind = np.array([_KIND.get(k, 3) for k in names], np.int64)[code]
    s = np.fromiter(map(itemgetter(1), acts), np.int64, len(acts))
    i = np.fromiter(map(itemgetter(2), acts), np.int64, len(acts))
    need, prod = _tokens(kind, s, i, stages)
    ntok = int(max(need.max(initial=-1), prod.max(initial=-1))) + 1
    at = np.repeat(np.arange(n), width)  # each action's step
    made = prod >= 0
    if np.bincount(prod[made], minlength=ntok).max(initial=0) > 1:
        raise ValueError("pipeline schedule runs an action twice")
    owner = np.full(ntok + 1, -1, np.int64)  # each token's producing step; the last: none
    owner[prod[made]] = at[made]
    q = np.where(need >= 0, owner[np.where(need >= 0, need, ntok)], _NONE)  # (acts, 2)
    if (q == -1).any():  # an input nobody makes: the sweep would stall on it
        raise _deadlock()
    # each step's input producers in `dependencies` order: its first action's, its second's
    head = np.cumsum(width) - width
    inputs = np.concatenate([q[head], np.where((width == 2)[:, None],
                                               q[np.minimum(head + 1, len(acts) - 1)],
                                               _NONE)], axis=1)  # (steps, 4)
    num = _sweep(lens, inputs)
    return _fields(lens, parts, names, code, s, width, inputs, num)


def _tokens(kind: IntArray, s: IntArray, i: IntArray, stages: int
            ) -> tuple[IntArray, IntArray]:
    """Each action's input tokens (acts, 2) in `dependencies` order and output token (acts,),
    -1 for none: F of (stage, mb) is 2·(stage' · span + mb'), its I that + 1 (stage' and mb'
    offset so that every stage - 1 .. stage + 1 and mb is >= 0)."""
    lo, ilo = int(s.min()) - 1, int(i.min())
    span = int(i.max()) - ilo + 1
    base = ((s - lo) * span + (i - ilo)) * 2
    is_f = kind == 0
    is_ib = (kind == 1) | (kind == 2)
    n1 = np.where(is_f, np.where(s > 0, base - 2 * span, -1), np.where(is_ib, base, base + 1))
    n2 = np.where(is_ib & (s < stages - 1), base + 2 * span + 1, -1)
    prod = np.where(is_f, base, np.where(is_ib, base + 1, -1))
    return np.stack([n1, n2], axis=1), prod


def _sweep(lens: Sequence[int], inputs: IntArray) -> list[int]:
    """The sweep's number of every step (steps in list order, rank by rank): a step runs once
    every producing step of its inputs has run (`inputs`, _NONE for none). An input made on
    the step's own rank was made by an earlier step of its list, which has run (one made by
    the step itself or a later one never is: a deadlock), so only inputs made on other ranks
    are waited for."""
    n = len(inputs)
    rank = np.repeat(np.arange(len(lens)), lens)
    src = np.where(inputs == _NONE, 0, inputs)
    here = (inputs != _NONE) & (rank[src] == rank[:, None])
    if (here & (src >= np.arange(n)[:, None])).any():
        raise _deadlock()
    waits = _pack(np.where(here, _NONE, inputs))
    k = int((waits != _NONE).sum(axis=1).max(initial=0))
    cols = [np.where(waits[:, j] == _NONE, n, waits[:, j]).tolist() for j in range(k)]
    cols += [[n] * n] * (2 - k) if k < 2 else []
    num = [-1] * n + [0]  # the last entry: an input with nothing to wait for
    off = np.concatenate([[0], np.cumsum(lens)]).tolist()
    at = off[:-1]
    done = 0
    if k <= 2:
        a, b = cols[0], cols[1]
        while done < n:
            moved = False
            for r in range(len(lens)):
                g, end = at[r], off[r + 1]
                g0 = g
                while g < end and num[a[g]] >= 0 and num[b[g]] >= 0:
                    num[g] = done
                    done += 1
                    g += 1
                if g > g0:
                    at[r] = g
                    moved = True
            if not moved:
                raise _deadlock()
        return num[:n]
    rows = list(zip(*cols, strict=True))
    while done < n:
        moved = False
        for r in range(len(lens)):
            g, end = at[r], off[r + 1]
            g0 = g
            while g < end and all(num[x] >= 0 for x in rows[g]):
                num[g] = done
                done += 1
                g += 1
            if g > g0:
                at[r] = g
                moved = True
        if not moved:
            raise _deadlock()
    return num[:n]


def _fields(lens: list[int], parts: list[tuple[Action, ...]], names: list[str],
            code: IntArray, s: IntArray, width: IntArray, inputs: IntArray,
            num_l: list[int]) -> Dag:
    """The `Dag` of the numbering `num_l` (step g of the rank-by-rank lists is step
    num_l[g]); `names[code[a]]` is action a's kind, `s[a]` its stage."""
    n = len(num_l)
    num = np.array(num_l, np.int64)
    order = np.argsort(num)
    rank_g = np.repeat(np.arange(len(lens)), lens)
    off = np.cumsum(lens) - np.array(lens)
    first_g = np.zeros(n, bool)
    first_g[off[np.array(lens) > 0]] = True
    last = tuple(int(num[off[r] + lens[r] - 1]) if lens[r] else -1 for r in range(len(lens)))
    prev = np.where(first_g, _NONE, np.concatenate([[_NONE], num[:-1]]))
    inp = np.where(inputs >= 0, num[np.maximum(inputs, 0)], _NONE)
    table = np.concatenate([prev[:, None], inp], axis=1)[order]  # (steps, 5), in run order
    rank = rank_g[order]
    # the slots: the previous step + 1 (0 on a rank's first), then the inputs on other ranks
    other = (table[:, 1:] != _NONE)
    other[other] = rank[table[:, 1:][other]] != np.repeat(rank, other.sum(axis=1))
    cols = np.where(other, table[:, 1:] + 1, _NONE)
    packed = _pack(cols)
    k = int((packed != _NONE).sum(axis=1).max(initial=0))
    slot0 = np.where(table[:, 0] == _NONE, 0, table[:, 0] + 1)
    slots = (tuple(slot0.tolist()),) + tuple(
        tuple(np.where(packed[:, j] == _NONE, 0, packed[:, j]).tolist()) for j in range(k))
    # the distinct (kind, stage), shapes, in order of first appearance
    head = np.cumsum(width) - width
    kc = code * (int(s.max()) - int(s.min()) + 1) + (s - int(s.min()))  # per action
    act_order = np.concatenate([head[order][:, None], np.where(
        (width[order] == 2)[:, None], (head[order] + 1)[:, None], -1)], axis=1).ravel()
    act_order = act_order[act_order >= 0]
    uk, ui, inv = np.unique(kc[act_order], return_index=True, return_inverse=True)
    rankof = np.empty(len(uk), np.int64)
    rankof[np.argsort(ui)] = np.arange(len(uk))
    kid = rankof[inv]  # each action (in run order) as an index into uniq
    first_act = act_order[np.sort(ui)]
    uniq = tuple((names[kk], ss) for kk, ss in
                 zip(code[first_act].tolist(), s[first_act].tolist(), strict=True))
    w = width[order]
    kpair = np.full((n, 2), _NONE, np.int64)
    pos = np.cumsum(w) - w
    kpair[:, 0] = kid[pos]
    kpair[w == 2, 1] = kid[pos[w == 2] + 1]
    sk = kpair[:, 0] * (len(uk) + 1) + np.where(kpair[:, 1] == _NONE, len(uk), kpair[:, 1])
    us, si, sinv = np.unique(sk, return_index=True, return_inverse=True)
    srank = np.empty(len(us), np.int64)
    srank[np.argsort(si)] = np.arange(len(us))
    shape = srank[sinv]
    shapes = _rows(kpair[np.sort(si)])
    get = itemgetter(*order.tolist())
    ordered = get(parts) if n > 1 else (parts[int(order[0])],)
    return Dag(tuple(rank.tolist()), tuple(ordered), tuple(first_g[order].tolist()), last,
               uniq, shapes, tuple(shape.tolist()), slots, table, kpair)


def _pack(table: IntArray) -> IntArray:
    """Each row's entries other than _NONE moved to the front, in order."""
    keep = table != _NONE
    out = np.full(table.shape, _NONE, np.int64)
    out[np.nonzero(keep)[0], (np.cumsum(keep, axis=1) - 1)[keep]] = table[keep]
    return out


def _rows(table: IntArray) -> tuple[tuple[int, ...], ...]:
    """Each row of `table` as a tuple of its entries other than _NONE, in order."""
    packed = _pack(table)
    size = (packed != _NONE).sum(axis=1)
    out: list[tuple[int, ...]] = [()] * len(table)
    for k in np.unique(size).tolist():
        idx = np.flatnonzero(size == k)
        for g, row in zip(idx.tolist(), map(tuple, packed[idx, :k].tolist()), strict=True):
            out[g] = row
    return tuple(out)
