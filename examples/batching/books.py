"""A book-translation back server as in seed 003, run inside Mainspring.

    PYTHONPATH=. mainspring serve --app examples.batching.books:app   # from the repository root
    python examples/batching/books.py submit 79               # submit the English and Russian books of 79

The worker receives whole packages (pairs of books, same version) and returns per-task results.
"""

from __future__ import annotations

import sys

from mainspring.app import App

app = App()


@app.batcher("books", min_size=2, max_size=6, linger_ms=5000, group_size=2, concurrency=2)
async def split_books(package) -> dict[str, dict[str, int]]:
    results = {}
    for task in package.tasks:
        sentences = [s for s in str(task.content).replace("!", ".").split(".") if s.strip()]
        results[task.id] = {"sentences": len(sentences), "version": task.version}
    return results


def submit(book: str, url: str = "http://127.0.0.1:8080") -> None:
    from mainspring.client.batching import BatchingClient

    with BatchingClient(url) as client:
        for member, text in (("en", f"Book {book}. In English."), ("ru", f"Книга {book}. По-русски.")):
            task = client.submit("books", id=f"{book}-{member}", group=book, member=member, content=text)
            print(task["id"], task["status"], task["reason"] or "", "version", task["version"])


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "submit":
        submit(sys.argv[2])
    else:
        print(__doc__)
