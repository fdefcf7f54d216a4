"""A book-translation back server (seed 003), run inside Mainspring. From the repository root:

    mainspring serve --app examples.batching.books:app            # or: mainspring worker examples.batching.books:app
    python -m examples.batching.books submit 79                   # the English and Russian books of 79
    python -m examples.batching.books submit 79 --url http://127.0.0.1:9000 --token ms_…

The worker receives whole packages (pairs of books, same version) and returns per-task results.
"""

from __future__ import annotations

import argparse
import os

from mainspring import App, Package

app = App()


@app.batcher("books", min_size=2, max_size=6, linger_ms=5000, group_size=2, concurrency=2)
async def split_books(package: Package) -> dict[str, dict[str, int | None]]:
    results: dict[str, dict[str, int | None]] = {}
    for task in package.tasks:
        sentences = [s for s in str(task.content).replace("!", ".").split(".") if s.strip()]
        results[task.id] = {"sentences": len(sentences), "version": task.version}
    return results


def submit(book: str, url: str, token: str | None = None) -> None:
    from mainspring.client import BatchingClient

    with BatchingClient(url, token) as client:
        for member, text in (("en", f"Book {book}. In English."), ("ru", f"Книга {book}. По-русски.")):
            task = client.submit("books", id=f"{book}-{member}", group=book, member=member, content=text)
            print(task["id"], task["status"], task["reason"] or "", "version", task["version"])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Submit a book's two translations to the books batcher.")
    parser.add_argument("command", choices=["submit"])
    parser.add_argument("book", help="the book's id (both members share it as their group)")
    parser.add_argument("--url", default=os.environ.get("MAINSPRING_URL", "http://127.0.0.1:8080"))
    parser.add_argument("--token", default=os.environ.get("MAINSPRING_TOKEN"))
    options = parser.parse_args()
    submit(options.book, options.url, options.token)
