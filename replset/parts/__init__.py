"""The part log's member side: inserting blocks, and (later) the replication queue's runner and the
part-exchange routes. The decisions are the pure modules of `oplog.parts`."""
