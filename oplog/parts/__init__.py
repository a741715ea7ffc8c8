"""The part log's pure pieces: part names and covering, the active part set, block ids and the dedup
window, the replication queue's scheduler and merge selection (ClickHouse ReplicatedMergeTree
semantics). No I/O: the runner, the HTTP routes and the fetcher carry their decisions out."""
