"""Triggers: the op whose completion starts a swap-in (a control edge into
it), at least `swapin_ahead` levels before the first reader and never one of
the reader's own descendants. `TriggerFinder` answers many searches of one
index fast."""

import array

import numpy as np

from tflms import analysis


# How far back from the latest allowed level the trigger search looks.
TRIGGER_SEARCH_LEVELS = 10


def _trigger_window(levels, src, first_consumer, ahead):
    """Levels ``[lower, upper)`` where a swap-in trigger may sit: after the
    source, `ahead` levels before the consumer, the last
    `TRIGGER_SEARCH_LEVELS` of that span."""
    upper = levels[first_consumer] - ahead
    return max(levels[src] + 1, upper - TRIGGER_SEARCH_LEVELS), upper


def find_trigger(index, roles, src, first_consumer, ahead):
    """The op that starts a swap-in: a *data* ancestor of the consumer that
    TensorFlow cannot merge with it (`may_trigger`), on the managed device
    and on the consumer's own device (towers of a multi-tower model start
    their own swap-ins), active, outside conditionals and loops, at a level
    in ``(level(src), level(consumer) - ahead)``, as late as possible; ties
    go to the lowest id.

    Why data ancestors only: the edges ``trigger -> swap-in -> consumer``
    then add no ordering between two graph ops that the graph's own data
    edges did not already impose, so no merge TensorFlow makes at run time
    on the unchanged graph can close a cycle through the swap-in (see
    `fusions.fusion_partners`). An ancestor through control edges only,
    such as the `BiasAddGrad` that `tf.gradients`' ``tuple`` identities make
    every sibling gradient wait for, gives no such guarantee.
    """
    levels = index.levels
    lower, upper = _trigger_window(levels, src, first_consumer, ahead)
    if upper <= lower:
        return None
    ancestors = analysis.ancestors_within(index, first_consumer, lower,
                                          data_only=True)
    best = None
    for a in ancestors:
        if levels[a] >= upper or not may_trigger(index, roles, a,
                                                 first_consumer):
            continue
        if best is None or (levels[a], -a) > (levels[best], -best):
            best = a
    return best


def may_trigger(index, roles, op, consumer):
    """True if `op` may start a swap-in read by `consumer`, given that it is
    a data ancestor of it: a trigger op on the consumer's device that
    TensorFlow will not merge with the consumer."""
    return (op in roles.triggers
            and op not in roles.fused_with.get(consumer, ())
            and analysis.same_device(index.devices[op],
                                     index.devices[consumer]))


def _data_reaches(index, op, consumer):
    """True if a path of data edges leads from `op` to `consumer`: a walk
    back from the consumer over data inputs, no lower than `op`'s level,
    that stops when it meets `op`."""
    levels = index.levels
    floor = levels[op]
    seen = {consumer}
    stack = [consumer]
    while stack:
        for p in index.fanins[stack.pop()]:
            if p == op:
                return True
            if p not in seen and levels[p] > floor:
                seen.add(p)
                stack.append(p)
    return False


_UNKNOWN = object()  # a fast search could not answer


def _int_array(values):
    return array.array("q", np.asarray(values, dtype=np.int64).tobytes())
# Ops with several inputs above the trigger window that one spine search
# follows before it leaves the answer to the walk.
_BRANCH_LIMIT = 256


class _Spines:
    """The spine of each op of an index, lifted for `TriggerFinder`'s
    searches (the comment above `TriggerFinder._latest_trigger`), and the
    best-trigger tables over it per consumer device, each built once.

    Attributes:
      spine: per op, its data input of highest level (lowest id among
        ties), -1 for none.
      jumps: ``jumps[k][v]``, the op ``2**k`` spine steps below v (-1:
        none).
      sides: ``sides[k][v]``, the highest level of the other data inputs
        of the ``2**k`` spine ops from v.
    """

    def __init__(self, index, roles):
        self.index = index
        self.roles = roles
        self._best_by_device = {}
        levels = index.levels
        n = index.num_ops
        spine = np.full(n, -1, dtype=np.int64)
        side = np.full(n, -1, dtype=np.int64)
        for v in range(n):
            ins = index.fanins[v]
            if not ins:
                continue
            top = ins[0]
            for p in ins[1:]:
                if levels[p] > levels[top]:
                    top = p
            spine[v] = top
            high = -1
            for p in ins:
                if p != top and levels[p] > high:
                    high = levels[p]
            side[v] = high
        jumps, sides = [spine], [side]
        while (1 << len(jumps)) <= index.num_levels:
            prev, prev_side = jumps[-1], sides[-1]
            nxt = np.maximum(prev, 0)
            jumps.append(np.where(prev >= 0, prev[nxt], -1))
            # side over the 2**k ops from v (only used where the jump exists)
            sides.append(np.where(prev >= 0,
                                  np.maximum(prev_side, prev_side[nxt]),
                                  prev_side))
        # array('q') reads single entries as Python ints several times
        # faster than numpy does, and the searches read one at a time.
        self.spine = _int_array(spine)
        self.jumps = [_int_array(j) for j in jumps]
        self.sides = [_int_array(x) for x in sides]

    def best_tables(self, device):
        """rest[] lifted like the spine, for consumers placed on `device`."""
        tables = self._best_by_device.get(device)
        if tables is not None:
            return tables
        index, roles = self.index, self.roles
        levels = index.levels
        n = index.num_ops
        spine = self.spine
        same = {}
        best = [-1] * n
        for level_ops in index.ops_by_level:
            for v in level_ops:
                b = -1
                if v in roles.triggers:
                    d = index.devices[v]
                    ok = same.get(d)
                    if ok is None:
                        ok = same[d] = analysis.same_device(d, device)
                    if ok:
                        b = levels[v] * n + (n - 1 - v)
                for p in index.fanins[v]:
                    if best[p] > b:
                        b = best[p]
                best[v] = b
        rest = np.full(n, -1, dtype=np.int64)
        for v in range(n):
            top = spine[v]
            r = -1
            for p in index.fanins[v]:
                if p != top and best[p] > r:
                    r = best[p]
            rest[v] = r
        rests = [rest]
        for jump in self.jumps[:-1]:
            jump = np.frombuffer(jump, dtype=np.int64)
            prev = rests[-1]
            rests.append(np.where(jump >= 0,
                                  np.maximum(prev, prev[np.maximum(jump, 0)]),
                                  prev))
        # cap[u]: the best rank of all that may trigger below level u. A
        # search that found it can stop: nothing can beat it.
        cap = [-1] * (index.num_levels + 1)
        for lvl, level_ops in enumerate(index.ops_by_level):
            top = cap[lvl]
            for v in level_ops:
                if v in roles.triggers and levels[v] * n + (n - 1 - v) > top \
                        and same.get(index.devices[v]):
                    top = levels[v] * n + (n - 1 - v)
            cap[lvl + 1] = top
        tables = (best, [_int_array(r) for r in rests], cap)
        self._best_by_device[device] = tables
        return tables


class TriggerFinder:
    """`find_trigger` for many swap-ins of one index, fast on deep graphs.

    The full search walks every ancestor of the consumer down to the
    trigger window, ``swapin_ahead`` levels times the graph's width, for
    every swap-in of every plan a search tries. But the latest allowed level
    is usually held by an op on the consumer's *critical path*: following
    from the consumer its lowest-id data input one level below goes down
    exactly one level per step (a Kahn level is one more than the highest
    input's; when a control input holds that level the chain ends),
    and binary lifting over that chain reaches any level in O(log levels)
    steps. When that op may start a swap-in it is taken: it has the level
    the full search would pick, and the simulator sees only levels. When it
    may not, the full search's answer is computed by `_latest_trigger`
    (same answer, logarithmic time on chain-shaped graphs), and only where
    that cannot answer does the full search walk the graph. Answers are
    remembered per (consumer, ahead, lowest allowed level) across the plans
    of one search.

    One class, because the binary-lifting jumps, the spines and their
    per-device best tables (`_Spines`) and the answer caches are built
    lazily and shared by `find`, `_latest_trigger`, `may_also_start` and
    the plans' edge memos; one object owns them so that each is built once
    per index and search.
    """

    def __init__(self, index, roles):
        self.index = index
        self.roles = roles
        self._cache = {}
        self._reaches = {}
        self._jumps = None
        self._spines = None
        # make_plan's candidate edges by tensor, and its answers per tensor,
        # shared by the plans of a search (valid for one list of edges).
        self._edges = None
        self._tensor_edges = ()
        self._swap_memo = {}

    def _build_jumps(self):
        index = self.index
        levels = index.levels
        chain = np.full(index.num_ops, -1, dtype=np.int64)
        for v in range(index.num_ops):
            below = levels[v] - 1
            for p in index.fanins[v]:  # data inputs, increasing ids
                if levels[p] == below:
                    chain[v] = p
                    break
        # jumps[k][v]: the op 2**k levels below v on its chain (-1: none;
        # serialization edges can leave an op without an input one level
        # below, and the full search then answers).
        jumps = [chain]
        while (1 << len(jumps)) <= index.num_levels:
            prev = jumps[-1]
            jumps.append(np.where(prev >= 0, prev[np.maximum(prev, 0)], -1))
        self._jumps = jumps

    def _on_chain(self, op, levels_down):
        if self._jumps is None:
            self._build_jumps()
        k = 0
        while levels_down and op >= 0:
            if levels_down & 1:
                op = int(self._jumps[k][op])
            levels_down >>= 1
            k += 1
        return op

    def find(self, src, first_consumer, ahead):
        """The trigger for a swap-in of `src` read first by
        `first_consumer`, or None (same contract as `find_trigger`)."""
        levels = self.index.levels
        key = (first_consumer, ahead, levels[src] + 1)
        if key in self._cache:
            return self._cache[key]
        lower, upper = _trigger_window(levels, src, first_consumer, ahead)
        trigger = None
        if upper > lower:
            op = self._on_chain(first_consumer,
                                levels[first_consumer] - (upper - 1))
            if op >= 0 and may_trigger(self.index, self.roles, op,
                                       first_consumer):
                trigger = op
            else:
                trigger = self._latest_trigger(first_consumer, lower, upper)
                if trigger is _UNKNOWN:
                    trigger = find_trigger(self.index, self.roles, src,
                                           first_consumer, ahead)
        self._cache[key] = trigger
        return trigger

    # ---- the full search without the walk --------------------------------
    # `find_trigger` answers with the best data ancestor of the consumer
    # below `upper` that may trigger, best meaning highest level, then
    # lowest id (or None if that one is below `lower`). Its walk covers
    # every ancestor between the consumer and the window: `swapin_ahead`
    # levels of the graph for every swap-in, which on a deep graph is most
    # of the planning time. The same best op follows from three arrays:
    #
    # * best[v]: the best op that may trigger among v and its data
    #   ancestors (one pass in level order; per consumer device, since a
    #   trigger must be on its consumer's device);
    # * the *spine* of v: its data input of highest level (ties: lowest id),
    #   and side[v], the highest level of its other data inputs;
    # * rest[v]: the best of best[] over those other inputs.
    #
    # While the spine ops from the consumer down to `upper` have their other
    # inputs below `upper` (side < upper), the ancestors below `upper` are
    # those of the other inputs of these ops plus those of the first spine
    # op below `upper`, so the answer is the best of their rest[] and that
    # op's best[]: a path maximum, answered by binary lifting over the spine
    # in O(log levels). An op with a second input at or above `upper` (a
    # join, as in a residual block) starts a spine search from each such
    # input; each join is expanded once. Ranks encode (level, -id) as one
    # integer.

    def _spine_tables(self):
        if self._spines is None:
            self._spines = _Spines(self.index, self.roles)
        return self._spines

    def _latest_trigger(self, consumer, lower, upper):
        """`find_trigger`'s answer for the window ``[lower, upper)``, or
        `_UNKNOWN` when the spines cannot give it cheaply."""
        index = self.index
        levels = index.levels
        if levels[consumer] < upper:
            return _UNKNOWN
        spines = self._spine_tables()
        spine, jumps, sides = spines.spine, spines.jumps, spines.sides
        best, rests, cap = spines.best_tables(index.devices[consumer])
        most = cap[upper]
        found = -1
        top = len(jumps) - 1
        stack, branched = [consumer], set()
        while stack and found < most:
            v = stack.pop()
            # Down v's spine while the ops stay at or above `upper` and
            # their other inputs below it. Each spine step goes down at
            # least one level, so jumps longer than levels[v] - upper land
            # below `upper`: the lifting starts at the longest that can
            # land (a query costs the log of its distance, not of the depth).
            reach = max(levels[v] - upper, 0).bit_length() - 1
            for k in range(min(top, reach), -1, -1):
                w = jumps[k][v]
                if w >= 0 and levels[w] >= upper and sides[k][v] < upper:
                    r = rests[k][v]
                    if r > found:
                        found = r
                    v = w
            if sides[0][v] < upper:
                # The next spine op is below `upper` (or there is none).
                r = rests[0][v]
                below = spine[v]
                if below >= 0 and best[below] > r:
                    r = best[below]
                if r > found:
                    found = r
                continue
            # v has several inputs at or above `upper`: follow each.
            if v in branched:
                continue
            branched.add(v)
            if len(branched) > _BRANCH_LIMIT:
                return _UNKNOWN  # as slow as the walk: let it answer
            ins = [p for p in index.fanins[v] if best[p] > found]
            # Lowest level searched first: it reaches the window soonest,
            # and what it finds prunes the rest (best[] bounds a search).
            ins.sort(key=lambda p: -levels[p])
            for p in ins:
                if levels[p] >= upper:
                    stack.append(p)
                elif best[p] > found:
                    found = best[p]
        if found < 0:
            return None
        n = index.num_ops
        op = n - 1 - found % n
        if levels[op] < lower:
            return None
        if op in self.roles.fused_with.get(consumer, ()):
            return _UNKNOWN  # the next best may be anywhere: walk
        return op

    def _use_edges(self, edges):
        if edges is self._edges:
            return
        grouped = []
        for p, out, consumer, slot, distance in edges:
            if not grouped or grouped[-1][:2] != (p, out):
                grouped.append((p, out, [], [], []))
            grouped[-1][2].append((consumer, slot))
            grouped[-1][3].append(distance)
        for _, _, _, distances, widest in grouped:
            # widest[k]: the largest level gap between consecutive
            # consumers from the k-th on.
            gap = 0
            widest.extend([0] * len(distances))
            for k in range(len(distances) - 2, -1, -1):
                gap = max(gap, distances[k + 1] - distances[k])
                widest[k] = gap
        self._edges = edges
        self._tensor_edges = tuple(grouped)
        self._swap_memo = {}

    def tensor_edges(self, edges):
        """`candidate_edges` grouped by tensor: ``(producer, output,
        [(consumer, slot)], [distance], [widest gap from here on])``,
        distances ascending."""
        self._use_edges(edges)
        return self._tensor_edges

    def swap_memo_for(self, edges):
        """make_plan's memo of swaps for plans made from `edges`."""
        self._use_edges(edges)
        return self._swap_memo

    def _reaches_by_spine(self, op, consumer):
        """`_data_reaches` by the spines: True if `op` is a data ancestor of
        `consumer`, or `_UNKNOWN`. Only inputs above `op`'s level can lead
        to it, so a spine is followed (by lifting) while its other inputs
        are below that level, and each join above it is expanded once."""
        index = self.index
        levels = index.levels
        spines = self._spine_tables()
        spine, jumps, sides = spines.spine, spines.jumps, spines.sides
        floor = levels[op]
        top = len(jumps) - 1
        stack, branched = [consumer], set()
        while stack:
            v = stack.pop()
            # Only jumps shorter than levels[v] - floor can stay above it.
            reach = max(levels[v] - floor - 1, 0).bit_length() - 1
            for k in range(min(top, reach), -1, -1):
                w = jumps[k][v]
                if w >= 0 and levels[w] > floor and sides[k][v] < floor:
                    v = w
            if sides[0][v] < floor:
                if spine[v] == op:
                    return True
                continue
            if v in branched:
                continue
            branched.add(v)
            if len(branched) > _BRANCH_LIMIT:
                return _UNKNOWN
            if op in index.fanins[v]:
                return True
            # Lowest level searched first: it reaches `op`'s level soonest.
            stack.extend(sorted((p for p in index.fanins[v]
                                 if levels[p] > floor),
                                key=lambda p: -levels[p]))
        return False

    def may_also_start(self, trigger, consumer):
        """True if `trigger`, found for an earlier consumer of the same
        swap-in, may start it for `consumer` as well: it reaches `consumer`
        through data edges and TensorFlow does not merge the two."""
        key = (trigger, consumer)
        if key not in self._reaches:
            reaches = False
            if consumer not in self.roles.fused_with.get(trigger, ()):
                reaches = self._reaches_by_spine(trigger, consumer)
                if reaches is _UNKNOWN:
                    reaches = _data_reaches(self.index, trigger, consumer)
            self._reaches[key] = reaches
        return self._reaches[key]
