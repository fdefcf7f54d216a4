"""HTTP routes of the batching face."""

from fastapi import APIRouter

router = APIRouter(prefix="/v1", tags=["batching"])
