"""Typed tasks (docs/interactions.md, "Typed tasks and their results"): run them with
``mainspring serve --app examples.interactions.tasks:app`` (or ``mainspring worker``), then enqueue from Python:

```python
from mainspring.client import AsyncInteractionsClient
from examples.interactions.tasks import app, make_thumbnail

async with AsyncInteractionsClient("http://127.0.0.1:8080") as client:
    job = await make_thumbnail.using(client).enqueue(url="https://example.org/cat.png", width=64)
    print(await job.result(timeout_s=30))
```
"""

from mainspring import App

app = App()


@app.task(max_attempts=3)
async def make_thumbnail(url: str, width: int = 128) -> dict[str, object]:
    if not url.startswith("https://"):
        raise ValueError(f"not an https URL: {url}")
    return {"url": url, "width": width, "thumbnail": f"{url.rsplit('/', 1)[-1]}@{width}"}


@app.task("invoice-totals")
def add_up(amounts: list[int], currency: str = "EUR") -> str:  # a sync task runs in a thread
    return f"{sum(amounts)} {currency}"
