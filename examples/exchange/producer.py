"""A mobile-side producer: drops orders into the ERP's mailbox. Message-Id makes retries safe.

    python examples/exchange/producer.py --server http://127.0.0.1:8080 --count 20 \
        --database "$(python examples/exchange/erp_worker.py --print-database-id)"
"""

from __future__ import annotations

import argparse
import json

from mainspring.client.exchange import ExchangeClient


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", default="http://127.0.0.1:8080")
    parser.add_argument("--token", default=None)
    parser.add_argument("--count", type=int, default=10)
    parser.add_argument("--database", required=True, help="the ERP database's id (erp_worker.py --print-database-id)")
    args = parser.parse_args()
    with ExchangeClient(args.server, args.token) as client:
        for i in range(args.count):
            order = {"customer": "mobile-7", "amount": 100 + i}
            message = client.store("erp", args.database, json.dumps(order).encode(), content_type="application/json",
                                   message_id=f"order-{i}", sender="mobile-7")
            print(message["id"], order)


if __name__ == "__main__":
    main()
