"""DTensor parameters of any placement on the engine's shards.

FSDP2's Shard(0) on a 1-D mesh of every process holds exactly the engine's rows layout (rank e
holds dim-0 slices [e * L, (e + 1) * L), L = ceil(rows / world)): the engine reads and writes
the local tensors in place. Other placements (HSDP's Replicate x Shard, tensor parallel's
Shard(1) and strided shards, expert stacks on their own mesh) hold other pieces; the engine
then cuts each flattened parameter evenly (the flat layout), and each process runs the engine
rank whose parts it holds the most of (engine_of: under HSDP the process at mesh (i, j) runs
rank j * R + i, whose parts lie in its own shard, so that no gradient moves). A parameter whose
processes each hold whole dim-0 slices, as many as the engine's rank of the same number holds,
is given to the engine in its holders' order: each process's slices are its rank's shard, so
they do not move. That holds an expert stack under expert parallelism (its experts do not
gather for Newton-Schulz either) and a ColwiseParallel weight under tensor parallelism with
FSDP2 or HSDP (a permutation of a matrix's rows commutes with Newton-Schulz). A matrix whose
processes each hold a rectangle of it (a RowwiseParallel weight there) is given to the engine as
those rectangles back to back (engine::set_box_order), so that they do not move either: the
engine's Newton-Schulz owner puts the matrix in its own order and back. This module says
which pieces each process holds (a pure function of the global shape, the mesh and the
placements) and moves values between them and the engine's shards: gradients in (each element
from one holder), new values out (to every holder, replicas included), one all_to_all_single of
the default process group each way."""

import math

try:
    import torch
    import torch.distributed as dist
except ImportError:  # the numpy path never builds a layout
    torch = None
    dist = None

from ._capi import InvalidArgument, Unsupported


def placement_text(placements):
    return "(" + ", ".join(str(p) for p in placements) + ")"


def _take(runs, lo, hi):
    """Positions [lo, hi) of the index sequence `runs` ((start, stop) runs in local order)."""
    out, pos = [], 0
    for start, stop in runs:
        n = stop - start
        a, b = max(lo, pos), min(hi, pos + n)
        if a < b:
            out.append((start + a - pos, start + b - pos))
        pos += n
    return out


def _count(runs):
    return sum(stop - start for start, stop in runs)


def _chunk(n, parts, i):
    """torch.chunk's piece i of n positions in `parts`: [i * c, min((i + 1) * c, n))."""
    c = -(-n // parts) if n else 0
    return min(n, i * c), min(n, (i + 1) * c)


def held_runs(shape, mesh_shape, coord, placements):
    """The global indices the process at mesh coordinate `coord` holds of a tensor of `shape`
    placed by `placements` on a mesh of `mesh_shape`: per dimension a list of (start, stop) runs
    in the local tensor's order (its elements are the outer product). Shard(d) cuts the current
    indices of dim d as torch.chunk does; _StridedShard(d, sf) cuts them into sf chunks and each
    chunk as Shard(d) would, the pieces back to back; Replicate keeps them. Left to right over
    the mesh dimensions, as DTensor does."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard
    runs = [[(0, int(n))] for n in shape]
    for mesh_dim, p in enumerate(placements):
        k, i = int(mesh_shape[mesh_dim]), int(coord[mesh_dim])
        if isinstance(p, Replicate):
            continue
        if not isinstance(p, (Shard, _StridedShard)):
            raise Unsupported(f"placement {p} on mesh dimension {mesh_dim}: zmuon takes "
                              "parameters placed by Shard, _StridedShard and Replicate")
        d = p.dim % len(shape)
        n = _count(runs[d])
        if isinstance(p, _StridedShard):
            sf = int(p.split_factor)
            pieces = []
            for j in range(sf):
                a, b = _chunk(n, sf, j)
                lo, hi = _chunk(b - a, k, i)
                pieces += _take(runs[d], a + lo, a + hi)
            runs[d] = pieces
        else:
            runs[d] = _take(runs[d], *_chunk(n, k, i))
    return [_merged(r) for r in runs]


def _merged(runs):
    out = []
    for start, stop in runs:
        if start == stop:
            continue
        if out and out[-1][1] == start:
            out[-1] = (out[-1][0], stop)
        else:
            out.append((start, stop))
    return out


def _indices(runs):
    """A dimension's runs as one int64 tensor of global indices."""
    return torch.cat([torch.arange(a, b, dtype=torch.int64) for a, b in runs]) if runs \
        else torch.zeros(0, dtype=torch.int64)


def _flat(index_per_dim, shape):
    """Row-major flat indices in `shape` of the outer product of per-dimension indices."""
    grids = torch.meshgrid(*index_per_dim, indexing="ij")
    strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    return sum(g * s for g, s in zip(grids, strides)).reshape(-1)


class _Piece:
    """The part of one holder's box inside one engine rank's shard: where it sits in the
    holder's local tensor and in the engine's buffer of that rank (flat indices: a slice where
    they are one run, as a piece read in place always is, else an int64 tensor)."""

    __slots__ = ("name", "local", "engine")

    def __init__(self, name, local, engine):
        self.name, self.local, self.engine = name, local, engine

    def numel(self):
        return self.local.stop - self.local.start


def _run_or_index(index):
    """Increasing distinct flat indices as a slice where they are one run, else as they are."""
    n = index.numel()
    if n and int(index[-1]) - int(index[0]) == n - 1:
        return slice(int(index[0]), int(index[-1]) + 1)
    return index


def _at(t, index):
    """t's flat elements at `index` (a slice: a view; an index tensor: a copy)."""
    return t[index] if isinstance(index, slice) else t[index.to(t.device)]


def _global_flat(runs, shape):
    """The flat indices in the whole tensor of the box `runs`, in the local tensor's order
    (increasing: each dimension's runs are)."""
    return _flat([_indices(r) for r in runs], list(shape))


def is_expert_stack(shape, view):
    """Whether the engine takes a parameter of `shape` under matrix view `view` ("auto",
    "flatten", "expert_stack") as a stack of independent [r, ...] matrices along dim 0."""
    return len(shape) >= 3 and (view == "expert_stack" or (view == "auto" and len(shape) == 3))


def _by_first_holder(boxes):
    """{first holder: held runs} of every box of `boxes` (held runs -> holders), and how many
    holders each box has (None where that differs between boxes)."""
    first = {min(holders): runs for runs, holders in boxes.items()}
    replicas = {len(holders) for holders in boxes.values()}
    return first, (replicas.pop() if len(replicas) == 1 else None)


def _holder_order(shape, boxes, world):
    """The dim-0 runs of every box in the order of its first holder, where each box is whole
    dim-0 slices and the boxes tile dim 0 as the engine's ranks do: without replicas, process e
    holds as many as torch.chunk gives engine rank e; with R replicas of every box (HSDP), each
    holds R ranks' worth, rows / world each (the flat layout's cut). None where not, or where
    that order is the natural one."""
    if any(r != ((0, int(n)),) for runs in boxes for r, n in zip(runs[1:], shape[1:])):
        return None
    first, replicas = _by_first_holder(boxes)
    if replicas is None:
        return None
    first = {q: runs[0] for q, runs in first.items()}
    order, rows = [], int(shape[0])
    if replicas == 1:
        for e in range(world):
            runs = first.get(e, ())
            lo, hi = _chunk(rows, world, e)
            if _count(runs) != hi - lo:
                return None
            order += runs
    else:
        part = rows // world * replicas
        if rows % world or any(_count(runs) != part for runs in first.values()):
            return None
        for q in sorted(first):
            order += first[q]
    return None if _merged(order) == [(0, rows)] else tuple(order)


def _box_order(shape, boxes, world):
    """The boxes (held runs) of a matrix of `shape` in the order of their first holders, where
    every box is one rectangle of equal size, none of whole rows (_holder_order's), and the flat
    layout's cut (numel / world) gives each box's R holders R ranks' worth; None where not."""
    numel = math.prod(shape)
    if len(shape) != 2 or numel % world:
        return None
    if any(len(r) != 1 for runs in boxes for r in runs):
        return None
    first, r = _by_first_holder(boxes)
    if r is None or len(first) * r != world:
        return None
    if any(_count(rows) * _count(cols) != numel // world * r for rows, cols in first.values()):
        return None
    order = [first[q] for q in sorted(first)]
    return None if all(cols == ((0, int(shape[1])),) for _, cols in order) else order


class MeshLayout:
    """The moves between every process's DTensor pieces and the engine's shards, for the
    parameters `named` (name, DTensor) of this process; `reorderable`: the names whose dim-0
    slices the engine may take in another order (reorderable_names()). Built from every process's
    description (one all_gather_object), so that each process derives the same moves."""

    def __init__(self, named, rank, world, reorderable=()):
        self.rank, self.world = rank, world
        self.device = named[0][1].to_local().device if named else "cpu"  # of the exchange
        mine = [(name, tuple(p.shape), _description(name, p)) for name, p in named]
        strided = [(n, p) for n, p in named if not p.to_local().is_contiguous()]
        every = [None] * world
        dist.all_gather_object(every, (mine, [(n, tuple(p.to_local().stride()))
                                              for n, p in strided[:1]]))
        for r, (_, bad) in enumerate(every):  # every process raises alike
            for n, stride in bad:
                raise Unsupported(f"the local tensor of '{n}' in process {r} is not contiguous "
                                  f"(strides {stride}): zmuon reads and writes it flat, in place")
        every = [theirs for theirs, _ in every]
        names = [n for n, _, _ in mine]
        for r, theirs in enumerate(every):
            if [n for n, _, _ in theirs] != names:
                raise InvalidArgument(f"process {r} registers other parameters than process "
                                      f"{rank}: every process passes the same named_parameters")
        self.shapes = {n: s for n, s, _ in mine}
        self.placements = {n: d[1] for n, _, d in mine}
        boxes = {}  # name -> {held runs: the processes holding them}
        for i, name in enumerate(names):
            shape, boxes[name] = self.shapes[name], {}
            for r in range(world):
                if every[r][i][1] != shape:
                    raise InvalidArgument(f"'{name}' has shape {every[r][i][1]} in process {r}, "
                                          f"{shape} in process {rank}")
                runs = every[r][i][2][0]
                if runs is not None and all(runs):
                    boxes[name].setdefault(runs, []).append(r)
            self._check_cover(name, shape, boxes[name])
        # order: the engine's dim-0 order of a parameter (runs of global indices), where it is
        # its holders' one.
        self.order = {n: _holder_order(self.shapes[n], boxes[n], world) for n in names
                      if n in reorderable}
        self.order = {n: o for n, o in self.order.items() if o is not None}
        # Every process holds exactly its rows (FSDP2's Shard(0) on every process, parameters
        # in their holders' order): the engine cuts by rows and nothing moves. Else the engine
        # cuts each flattened parameter evenly, where a parameter keeps its holders' order only
        # if that cut is its rows'.
        self.identity = all(all(
            len(holders) == 1 and (n in self.order
                                   or runs == _rows_box(self.shapes[n], world, holders[0]))
            for runs, holders in boxes[n].items()) for n in names)
        if not self.identity:
            self.order = {n: o for n, o in self.order.items() if self.shapes[n][0] % world == 0}
        self._position = {n: _positions(o, self.shapes[n][0]) for n, o in self.order.items()}
        # boxes: the engine's order of a matrix held in rectangles (_box_order), as (row0, rows,
        # col0, cols) for the engine (set_box_order); _box_of: each box's place in it.
        box_runs = {} if self.identity else {
            n: o for n in names if n in reorderable and n not in self.order
            for o in [_box_order(self.shapes[n], boxes[n], world)] if o is not None}
        self.boxes = {n: [(r[0][0], r[0][1] - r[0][0], c[0][0], c[0][1] - c[0][0])
                          for r, c in o] for n, o in box_runs.items()}
        self._box_of = {n: {runs: k for k, runs in enumerate(o)} for n, o in box_runs.items()}
        # engine_of[process]: the engine rank it runs; process_of[engine rank], the other way.
        self.engine_of = list(range(world)) if self.identity else self._engine_ranks(boxes)
        self.process_of = [0] * world
        for process, e in enumerate(self.engine_of):
            self.process_of[e] = process
        # in: (source, the engine rank's process) -> pieces; out: (the engine rank's process,
        # holder) -> pieces.
        self._in, self._out = {}, {}
        self._runs = {}  # name -> _own_run's answer
        for name in names:
            for runs, holders in boxes[name].items():
                if rank in holders or not self.identity:
                    self._add_pieces(name, runs, holders)

    def _engine_ranks(self, boxes):
        """engine_of for the flat layout: engine rank e, in turn, to the process not yet given
        one that holds the most of e's part of every parameter (ties: the lowest), where that
        leaves more in place than process e running rank e. Under HSDP (Replicate x Shard(0),
        rows the world divides) each engine rank's part then lies in its process's shard: the
        gradients do not move, and the new values go only to the shard's replicas."""
        world = self.world
        held = [{} for _ in range(world)]  # held[e][process]: elements of e's part it holds
        for name, by_runs in boxes.items():
            part = -(-math.prod(self.shapes[name]) // world)  # the flat layout's part
            for runs, holders in by_runs.items():
                glob = self._engine_flat(name, runs)
                if not part or not glob.numel():
                    continue
                # only the engine ranks whose parts meet the box (glob is sorted)
                for e in range(int(glob[0]) // part, int(glob[-1]) // part + 1):
                    lo, hi = self.engine_range(name, e)
                    n = int(torch.searchsorted(glob, hi)) - int(torch.searchsorted(glob, lo))
                    for h in holders:
                        held[e][h] = held[e].get(h, 0) + n
        engine_of, free = [None] * world, set(range(world))
        for e in range(world):
            best = max((q for q in held[e] if q in free), key=lambda q: (held[e][q], -q),
                       default=None)
            process = min(free) if best is None or held[e][best] == 0 else best
            engine_of[process] = e
            free.discard(process)
        in_place = sum(held[e].get(q, 0) for q, e in enumerate(engine_of))
        return engine_of if in_place > sum(held[e].get(e, 0) for e in range(world)) \
            else list(range(world))

    def _add_pieces(self, name, runs, holders):
        """The pieces of the box `runs` (held by `holders`) this process sends or receives:
        each engine rank's part from one holder (its own process where that is one), and to
        every holder."""
        me, glob = self.rank, self._engine_flat(name, runs)
        for e in range(self.world):
            host = self.process_of[e]  # the process that runs engine rank e
            src = host if host in holders else holders[e % len(holders)]
            if me not in (src, host) and me not in holders:
                continue
            lo, hi = self.engine_range(name, e)
            a, b = (int(torch.searchsorted(glob, x)) for x in (lo, hi))
            if a == b:
                continue
            engine = _run_or_index(glob[a:b] - lo)
            if not isinstance(engine, slice):
                engine = engine.to(self.device)  # where the moves run
            piece = _Piece(name, slice(a, b), engine)
            if me in (src, host):
                self._in.setdefault((src, host), []).append(piece)
            for h in holders:
                if me in (host, h):
                    self._out.setdefault((host, h), []).append(piece)

    def _engine_flat(self, name, runs):
        """The engine's flat indices of the box `runs` of `name`, in the local tensor's order
        (increasing: a reordered box is one holder's dim-0 slices back to back, or one of a
        matrix's boxes)."""
        shape = list(self.shapes[name])
        if name in self.boxes:  # box k: engine elements [k * size, (k + 1) * size)
            k = self._box_of[name][runs]
            size = math.prod(shape) // len(self.boxes[name])
            return torch.arange(k * size, (k + 1) * size, dtype=torch.int64)
        if name not in self._position:
            return _global_flat(runs, shape)
        index = [_indices(r) for r in runs]
        return _flat([self._position[name][index[0]]] + index[1:], shape)

    def in_engine_order(self, name, whole, moments=False):
        """A whole tensor of `name`'s shape (or, `moments`, NorMuon's row moments: (rows, 1),
        or (E, r, 1) of an expert stack) in the engine's order (a torch tensor or numpy array):
        its rows in their holders' order, or its elements in its boxes' (the row moments of a
        matrix in boxes are the natural matrix's: the engine's owner keeps them)."""
        if name in self.boxes and not moments:
            return _flat_at(whole, _box_positions(self.boxes[name], self.shapes[name]))
        if name not in self.order:
            return whole
        return _rows_at(whole, _indices(self.order[name]))

    def in_natural_order(self, name, ordered, moments=False):
        """in_engine_order's inverse: a whole tensor of `name` (or its row moments) from the
        engine's order back to its own."""
        if name in self.boxes and not moments:
            return _flat_at(ordered, torch.argsort(_box_positions(self.boxes[name],
                                                                  self.shapes[name])))
        if name not in self.order:
            return ordered
        return _rows_at(ordered, self._position[name])

    def sent_elements(self, values_out=True):
        """Elements this process sends to other processes per step: gradients in, and (with
        values_out) new values out."""
        me = self.rank
        return sum(pc.numel() for moves in (self._in, self._out)[:1 + values_out]
                   for (a, b), pieces in moves.items() if a == me != b for pc in pieces)

    def rank_note(self):
        """Where process r need not run zmuon's rank r, the words that say which runs which
        (zmuon's errors name its ranks); else ""."""
        if self.engine_of == list(range(self.world)):
            return ""
        return f"zmuon's ranks 0 to {self.world - 1} run in torch.distributed's processes " \
            + ", ".join(map(str, self.process_of))

    def engine_range(self, name, e):
        """The flat elements [lo, hi) of parameter `name` that engine rank e holds."""
        shape = self.shapes[name]
        if self.identity:
            lo, hi = _chunk(shape[0], self.world, e)
            row = math.prod(shape[1:])
            return lo * row, hi * row
        return _chunk(math.prod(shape), self.world, e)

    def _check_cover(self, name, shape, boxes):
        held = sum(math.prod(_count(r) for r in runs) for runs in boxes)
        if held != math.prod(shape):
            raise Unsupported(f"'{name}' placed {placement_text(self.placements[name])}: its "
                              f"processes hold {held} distinct elements of {math.prod(shape)}")

    def engine_len(self, name):
        lo, hi = self.engine_range(name, self.engine_of[self.rank])
        return hi - lo

    def _own_run(self, name):
        """(a, b) where this rank's engine shard of `name` is this process's own local tensor's
        flat elements [a, b), in order (under HSDP); else None. Its own piece then covers the
        whole shard, so no other process sends it any."""
        if name not in self._runs:
            run, n = None, self.engine_len(name)
            mine = [pc for pc in self._in.get((self.rank, self.rank), ()) if pc.name == name]
            if len(mine) == 1 and n > 0 and mine[0].numel() == n \
                    and mine[0].engine == slice(0, n):
                run = (mine[0].local.start, mine[0].local.start + n)
            self._runs[name] = run
        return self._runs[name]

    def own_view(self, name, local):
        """This rank's engine shard of `name` as a view of this process's local tensor `local`
        (fp32), where it is one run of it (_own_run); else None."""
        run = self._own_run(name)
        if run is None or local is None or local.dtype != torch.float32:
            return None
        return _flat_view(local.detach(), name)[run[0]:run[1]]

    def to_engine(self, locals_):
        """This rank's engine shards of the parameters named in `locals_` (name -> this process's
        local tensor, None where it has none: zeros) from every process's local tensors; every
        process calls it with the same names. Returns name -> flat tensor: own_view where there
        is one (no copy), else an fp32 copy."""
        device = _device(locals_)
        flat = {n: _flat_view(t.detach(), n) for n, t in locals_.items() if t is not None}
        out = {n: self.own_view(n, t) for n, t in locals_.items()}
        copied = {n for n, t in out.items() if t is None}
        for n in copied:
            out[n] = torch.zeros(self.engine_len(n), dtype=torch.float32, device=device)
        self._exchange(self._in, set(locals_),
                       lambda pc: _read(flat.get(pc.name), pc.local, device),
                       lambda pc, v: _write(out[pc.name], pc.engine, v), own=copied)
        return out

    def from_engine(self, rows, locals_):
        """Every holder's local tensors (name -> tensor, written in place) from the engine's
        shards (name -> this rank's flat tensor: one that is own_view's needs no copy); every
        process calls it with the same names."""
        flat = {n: _flat_view(t, n) for n, t in locals_.items()}
        own = {n for n, t in locals_.items() if not _same_memory(rows[n], self.own_view(n, t))}
        with torch.no_grad():  # parameters' local tensors, written in place
            self._exchange(self._out, set(locals_),
                           lambda pc: _at(rows[pc.name], pc.engine).float(),
                           lambda pc, v: _write(flat[pc.name], pc.local, v), own=own)

    def _exchange(self, moves, names, read, write, own=None):
        """Each (sender, receiver) pair's pieces of parameters `names`, in the same order on
        both sides: the own ones copied (of the names in `own`, default all), the others in one
        all_to_all_single."""
        me = self.rank

        def of(a, b):
            return [pc for pc in moves.get((a, b), ()) if pc.name in names]
        for pc in of(me, me):
            if own is None or pc.name in own:
                write(pc, read(pc))
        if self.identity:
            return
        send_sizes, recv_sizes, parts = [], [], []
        for r in range(self.world):
            out = [] if r == me else of(me, r)
            parts += [read(pc) for pc in out]
            send_sizes.append(sum(pc.numel() for pc in out))
            recv_sizes.append(0 if r == me else sum(pc.numel() for pc in of(r, me)))
        send = torch.cat([p.to(self.device) for p in parts]) if parts \
            else torch.zeros(0, dtype=torch.float32, device=self.device)
        recv = torch.empty(sum(recv_sizes), dtype=torch.float32, device=self.device)
        dist.all_to_all_single(recv, send, recv_sizes, send_sizes)
        pos = 0
        for r in range(self.world):
            for pc in [] if r == me else of(r, me):
                write(pc, recv[pos:pos + pc.numel()])
                pos += pc.numel()


def _rows_at(whole, index):
    """Dim 0 of `whole` (a torch tensor or numpy array) at the positions `index`."""
    return whole[index] if hasattr(whole, "index_select") else whole[index.numpy()]


def _flat_at(whole, index):
    """`whole` (a torch tensor or numpy array) with its flat elements at `index`, its shape
    kept."""
    flat = whole.reshape(-1)
    return (flat[index] if hasattr(whole, "index_select") else flat[index.numpy()]) \
        .reshape(whole.shape)


def _box_positions(boxes, shape):
    """The natural flat index of each element of a matrix of `shape` held as `boxes` back to
    back."""
    return torch.cat([_global_flat((((r0, r0 + rows),), ((c0, c0 + cols),)), shape)
                      for r0, rows, c0, cols in boxes])


def _same_memory(a, b):
    """Whether tensors `a` and `b` (None: no) are the same elements of the same memory."""
    return a is not None and b is not None and a.dtype == b.dtype and a.numel() == b.numel() \
        and a.data_ptr() == b.data_ptr()


def _positions(order, n):
    """The inverse of dim-0 order `order` (runs): global index -> the engine's index."""
    pos = torch.empty(n, dtype=torch.int64)
    pos[_indices(order)] = torch.arange(n, dtype=torch.int64)
    return pos


def _rows_box(shape, world, e):
    """The engine's rows of rank e as held runs."""
    lo, hi = _chunk(shape[0], world, e)
    return tuple([((lo, hi),)] + [((0, int(n)),) for n in shape[1:]])


def _device(tensors):
    for t in tensors.values():
        if t is not None:
            return t.device
    return "cpu"


def _flat_view(t, name):
    if not t.is_contiguous():  # made so after the optimizer (checked when it was made)
        raise Unsupported(f"the local tensor of '{name}' is not contiguous (strides "
                          f"{tuple(t.stride())}): zmuon reads and writes it flat, in place")
    return t.view(-1)


def _write(flat, index, values):
    values = values.to(flat.device, flat.dtype)
    if isinstance(index, slice):
        flat[index].copy_(values)
    else:
        flat.index_copy_(0, index.to(flat.device), values)


def _read(flat, index, device):
    if flat is None:
        n = index.stop - index.start if isinstance(index, slice) else index.numel()
        return torch.zeros(n, dtype=torch.float32, device=device)
    return _at(flat, index).float()


def check_placements(name, p):
    """Refuses DTensor parameter `p` where a placement holds no values of it."""
    from torch.distributed.tensor import Partial
    placements = tuple(p.placements)
    if any(isinstance(pl, Partial) for pl in placements):
        raise Unsupported(f"'{name}' is placed {placement_text(placements)} on a mesh of "
                          f"{tuple(p.device_mesh.shape)}: a Partial parameter holds a part of a "
                          "sum, not values; zmuon takes Shard, _StridedShard and Replicate")


def _description(name, p):
    """(this process's held runs or None, the placements) of DTensor `p`."""
    check_placements(name, p)
    placements = tuple(p.placements)
    mesh = p.device_mesh
    coord = mesh.get_coordinate()
    if coord is None:
        return None, placements
    runs = held_runs(tuple(p.shape), tuple(mesh.shape), coord, placements)
    return tuple(tuple(r) for r in runs), placements


def layout_of(named, rank, world, reorderable=()):
    """The moves of DTensor parameters `named` (name, DTensor), or None where every process
    holds exactly its engine rows in their natural order (FSDP2's Shard(0) on a 1-D mesh of
    every process)."""
    layout = MeshLayout(named, rank, world, reorderable)
    return None if layout.identity and not layout.order else layout


def reorderable_names(named, views, fixed):
    """The names of `named` (name, DTensor) whose dim-0 slices the engine may hold in any
    order: an expert stack (is_expert_stack under `views`, zmuon.Muon's matrix views), whose
    experts are independent matrices, and every other parameter not in `fixed`. A permutation
    of a matrix's rows commutes with Newton-Schulz (P X -> P NS(X)), with NorMuon's row
    moments (they follow their rows) and with AdamW (element-wise). `fixed`: the names whose
    rows form blocks in their order (heads, split_sizes, MuonClip's query and key heads)."""
    return {n for n, p in named
            if is_expert_stack(tuple(p.shape), views.get(n, "auto")) or n not in fixed}


def layout_for(named, views, fixed=()):
    """layout_of for zmuon.Muon's DTensor parameters `named` (name, DTensor; the zero-size
    ones stay out of the engine) over torch.distributed's default group; `views` and `fixed`
    as reorderable_names() takes them."""
    named = [(n, p) for n, p in named if p.numel() > 0]
    return layout_of(named, dist.get_rank(), dist.get_world_size(),
                     reorderable_names(named, views, set(fixed)))


def check_rank(engine_rank, layout):
    """The engine's rank of this process is the one `layout` (a MeshLayout, or None: the
    default process group's rank) gave it."""
    rank = dist.get_rank()
    want = rank if layout is None else layout.engine_of[rank]
    if engine_rank != want:
        raise InvalidArgument(f"this process is rank {rank} of torch.distributed's default "
                              f"group and should run rank {want} of zmuon's job, but runs "
                              f"rank {engine_rank}")


def any_process(flag):
    """Whether `flag` is true in some process (a collective)."""
    t = torch.tensor([1 if flag else 0], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())
