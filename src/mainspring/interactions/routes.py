"""HTTP routes of the interactions face."""

from fastapi import APIRouter

router = APIRouter(prefix="/v1", tags=["interactions"])
