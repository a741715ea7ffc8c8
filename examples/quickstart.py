"""Write and read through a real driver against `make run` (one member on 27017).

    make run                       # in one terminal
    .venv/bin/python examples/quickstart.py
"""

from __future__ import annotations

import asyncio

from motor.motor_asyncio import AsyncIOMotorClient
from pymongo import WriteConcern


async def main(uri: str = "mongodb://127.0.0.1:27017/?replicaSet=rs0") -> None:
    client: AsyncIOMotorClient[dict[str, object]] = AsyncIOMotorClient(uri)
    orders = client.shop.get_collection("orders", write_concern=WriteConcern(w="majority", j=True))
    await orders.replace_one({"_id": 1}, {"_id": 1, "qty": 5}, upsert=True)
    await orders.update_one({"_id": 1}, {"$inc": {"qty": 1}})
    print("orders with qty > 3:", await orders.count_documents({"qty": {"$gt": 3}}))
    # The update was logged as its result, not as the $inc:
    entry = await client.local["oplog.rs"].find_one({"ns": "shop.orders", "op": "u"}, sort=[("$natural", -1)])
    print("last oplog entry for shop.orders:", entry["o"] if entry else None)
    client.close()


if __name__ == "__main__":
    asyncio.run(main())
