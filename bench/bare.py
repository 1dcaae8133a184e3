"""A bare FastAPI endpoint under the same uvicorn setup as the gateway, the baseline for webhook
throughput: `python -m bench.bare PORT [WORKERS]`."""

from __future__ import annotations

import sys

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

app = FastAPI()


@app.post("/webhooks/telegram")
async def webhook(request: Request) -> JSONResponse:
    await request.body()
    return JSONResponse({"ok": True})


@app.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


def main() -> None:
    # The gateway's own settings (gateway/cli.py): no access log, proxy headers; `PORT [WORKERS]`.
    workers = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    uvicorn.run("bench.bare:app", host="127.0.0.1", port=int(sys.argv[1]), workers=workers, log_config=None,
                proxy_headers=True, access_log=False)


if __name__ == "__main__":
    main()
