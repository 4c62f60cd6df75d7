"""The server bench/score_load.py holds `bradley serve` against, run as its own process on 127.0.0.1
(same uvicorn, same loop and HTTP parser):

    python bench/reference_servers.py naive MODEL_DIR PORT   # one forward per request

It answers `POST /score` (so the same clients drive it) and `GET /readyz`."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from starlette.requests import Request  # the naive server's handler annotation, resolved at import

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def naive_server(model_dir: str, port: str) -> None:
    """One forward per request, run inside the request handler: OpenRLHF serve_rm.py's shape."""
    import torch
    import uvicorn
    from fastapi import FastAPI

    from rm.model.reward_model import RewardModel

    torch.set_num_threads(int(os.environ["BRADLEY_TORCH_THREADS"]))
    model = RewardModel.load(model_dir, device=os.environ.get("BRADLEY_DEVICE", "cpu"))
    app = FastAPI()

    @app.post("/score")
    async def score(request: Request):
        items = (await request.json())["items"]
        return {"scores": model.score([i["prompt"] for i in items], [i["response"] for i in items],
                                      batch_size=len(items))}

    @app.get("/readyz")
    async def ready():
        return {"status": "ready"}

    uvicorn.run(app, host="127.0.0.1", port=int(port), log_level="warning", access_log=False)


if __name__ == "__main__":
    naive_server(*sys.argv[2:])  # argv[1] names the server: `naive`, the one here
