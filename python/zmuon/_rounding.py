"""How the fp32 masters go into bf16 parameters: rounded to nearest (torch's copy_), or
stochastically (rounding="stochastic"): uniform random bits added below bf16's cut, then
truncated, so a value rounds up with the probability of its distance from the lower neighbour
(unbiased: the mean of many roundings is the master). The bits come from one torch.Generator per
device, seeded at each write-back from rounding_seed and the optimizer's step: a run is
reproducible, and a run resumed from a state_dict (which carries the step) draws the bits the
uninterrupted run drew."""

from ._capi import InvalidArgument

try:
    import torch
except ImportError:  # the numpy path: nothing is rounded
    torch = None

MODES = ("nearest", "stochastic")
_LOW_BITS = 1 << 16  # bf16 keeps the high 16 bits of an fp32


def _seed_of(seed, step):
    """The generators' seed for the write-back after step `step` (an LCG's step mixes the two)."""
    return (seed * 6364136223846793005 + step * 1442695040888963407 + 1) % (1 << 63)


def stochastic_bf16(values, generator):
    """fp32 `values` (contiguous) rounded stochastically to bf16; non-finite values as they are."""
    bits = values.view(torch.int32)
    noise = torch.randint(0, _LOW_BITS, values.shape, dtype=torch.int32, device=values.device,
                          generator=generator)
    rounded = ((bits + noise) & -_LOW_BITS).view(torch.float32)
    return torch.where(torch.isfinite(values), rounded, values).to(torch.bfloat16)


def is_a_rounding(local, master):
    """Whether bf16 `local` is, element by element, one of the two bf16 neighbours of fp32
    `master` (what a stochastic rounding of it may give)."""
    bits = master.contiguous().view(torch.int32) & -_LOW_BITS
    down = bits.view(torch.float32).to(torch.bfloat16)  # toward zero: exact
    up = (bits + _LOW_BITS).view(torch.float32).to(torch.bfloat16)
    return bool(((local == down) | (local == up) | (local.isnan() & master.isnan())).all())


class Rounding:
    """zmuon.Muon's rounding of the masters into bf16 parameters."""

    def __init__(self, mode, seed):
        if mode not in MODES:
            raise InvalidArgument(f"rounding must be one of {', '.join(MODES)}, got {mode!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise InvalidArgument(f"rounding_seed must be a whole number >= 0, got {seed!r}")
        self.stochastic = mode == "stochastic"
        self.seed = seed
        self.step = 0  # the optimizer's step the next write-back follows
        self._generators = {}  # device -> torch.Generator
        self._seeded = set()  # the devices whose generator this write-back has seeded

    def __deepcopy__(self, memo):
        """The same mode, seed and step, each generator at its position (a deep-copied
        optimizer draws the bits the original would)."""
        twin = Rounding("stochastic" if self.stochastic else "nearest", self.seed)
        twin.step, twin._seeded = self.step, set(self._seeded)
        for device, gen in self._generators.items():
            twin._generators[device] = torch.Generator(device)
            twin._generators[device].set_state(gen.get_state())
        return twin

    def begin(self, step=None):
        """A write-back starts, after optimizer step `step` (None: the last one given): each
        device's generator is seeded anew from the seed and the step at its first draw."""
        if step is not None:
            self.step = int(step)
        self._seeded = set()

    def applies_to(self, local):
        return self.stochastic and torch is not None and local.dtype == torch.bfloat16

    def into(self, local, master):
        """The master's values into bf16 parameter `local`."""
        device = master.device
        gen = self._generators.get(device)
        if gen is None:
            gen = self._generators[device] = torch.Generator(device)
        if device not in self._seeded:
            gen.manual_seed(_seed_of(self.seed, self.step))
            self._seeded.add(device)
        local.data.copy_(stochastic_bf16(master, gen))
