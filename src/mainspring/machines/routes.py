"""HTTP routes of the machines face."""

from fastapi import APIRouter

router = APIRouter(prefix="/v1", tags=["machines"])
