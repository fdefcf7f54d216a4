"""HTTP routes of the exchange face."""

from fastapi import APIRouter

router = APIRouter(prefix="/v1", tags=["exchange"])
