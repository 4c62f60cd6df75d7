"""Launched by torchrun in tests/rm/train/test_torchrun.py: runs the `bradley` CLI in this rank, then saves
the weights this rank trained to $RANK_WEIGHTS/rank<R>.safetensors (and the ones it started from to
rank<R>.start.safetensors), so the test can compare what each process ended with. The model is
observed where the training loop hands it to rm.model.device.wrap; nothing in the run is replaced."""

import os
import sys

from safetensors.torch import save_file

from rm.model import device
from service.cli import main as cli

seen = []
_wrap = device.wrap


def observing_wrap(model, dev, info):
    seen.append((model, {k: v.detach().clone() for k, v in model.state_dict().items()}))
    return _wrap(model, dev, info)


device.wrap = observing_wrap
try:  # the loop may hold the wrapper in a table made at import (rm/train/loop.py: WRAPPERS)
    from rm.train import loop

    loop.WRAPPERS["ddp"] = observing_wrap
except ImportError:
    pass

if __name__ == "__main__":
    status = cli.main(sys.argv[1:])
    model, start = seen[-1]
    out, rank = os.environ["RANK_WEIGHTS"], os.environ["RANK"]
    final = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(final, os.path.join(out, f"rank{rank}.safetensors"))
    save_file({k: v.contiguous() for k, v in start.items()},
              os.path.join(out, f"rank{rank}.start.safetensors"))
    sys.exit(status)
