"""The optimizer: how a kernel's loops are cut and laid out before it is lowered.

- `actions.py`: a kernel's plan (`Kernel`) and the actions that reshape it (`Opt`: upcast, unroll, local, group,
  tensor cores ...), each checked for legality before it applies;
- `heuristic.py`: the hand-written rules that choose the actions by default (`hand_opts`);
- `beam.py`: BEAM search, which times candidate actions on the device and caches the winner.
"""

from tiny.codegen.opt.actions import Kernel, KernelOptError, Kind, Opt, OptOps

__all__ = ["Kernel", "KernelOptError", "Kind", "Opt", "OptOps"]
