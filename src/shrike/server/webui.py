"""The chat page at / (off with --no-web-ui): static files shipped in shrike/server/web, no build step."""
from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

WEB_DIR = Path(__file__).parent / "web"


def mount_web_ui(app: FastAPI) -> None:
    @app.get("/", include_in_schema=False)
    async def chat_page() -> FileResponse:
        # no-cache: a browser revalidates, so an upgraded server never runs with yesterday's script
        return FileResponse(WEB_DIR / "index.html", headers={"Cache-Control": "no-cache"})

    app.mount("/web", StaticFiles(directory=WEB_DIR), name="web")
