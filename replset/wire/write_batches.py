"""Write commands' statements, run so that no group commit holds the event loop for long.

Theory of operation. Group commits run on the event loop (a commit costs a few page writes; handing it
to a thread and back would cost as much again on every write), so what one commit does must stay
small whatever the command holds:

- **Slices**: the statements of an insert, update or delete run `WRITE_SLICE` at a time, one group
  commit each (a few milliseconds of work for small documents). As in mongod a batch is not atomic, each
  statement is; an ordered batch stops at its first error; indexes are the batch's.
- **Scans off the loop**: a statement whose filter is not an `_id` equality first finds the `_id`s of
  the documents it matches on the query pool (`find_candidates`: a scan, the regex budget, the sort of
  `updateOne`), then applies itself to those documents only, looked up by `_id` and matched again in
  the transaction (a document changed meanwhile is skipped). A multi statement applies itself
  `MULTI_SLICE` documents per commit. A single-document statement whose candidate changed in between
  (another writer took it: a job queue) looks again, up to `CANDIDATE_RETRIES` times, then scans in
  the transaction, so a job queue is never answered "nothing left" while a job it saw remains. An
  upsert inserts when the scan found nothing; a matching document inserted by another client between
  that scan and the commit is not seen, so, as in mongod, concurrent upserts without a unique index
  on the filter's fields can insert twice. A statement stops at its first error (the documents of
  that statement's failing commit are rolled back with it; earlier commits stay).
- **Retryable writes**: a batch keeps its progress in its session record after each commit (how many
  statements are done, and their results so far); a retry after an interruption resumes after the
  last commit, and a retry after success gets the stored reply. (A multi statement interrupted part way
  runs again from its start on retry; mongod does not retry multi statements either.)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from base.errors import MongoError
from base.optime import OpTime
from oplog.clustered import natural_order
from oplog.collation import Collation, collated_matcher, parse_collation
from oplog.sort import sort_payloads
from oplog.writes import WriteEnv, WriteResult, error_doc, id_equality, statement_evaluates_expressions
from replset.query_pool import TimeLimit, time_checked
from replset.wire import sessions
from replset.write_concern import parse_write_concern, write_concern_error_field

if TYPE_CHECKING:
    from replset.wire.commands import CommandContext

WRITE_SLICE = 128
# Documents a multi statement updates or deletes per commit: each costs more than an insert (looked
# up, matched again, changed, its index keys and the oplog entry written).
MULTI_SLICE = 64
CANDIDATE_RETRIES = 3

Candidates = Mapping[int, Sequence[Any]]
Perform = Callable[[WriteEnv, str, list[Any], bool, Candidates | None], WriteResult]


class StaleCandidates(MongoError):
    """A single-document statement's candidate no longer matches: its commit is rolled back and the
    statement looks for candidates again."""

    def __init__(self) -> None:
        super().__init__(112, "the matching document changed before the write")


class _BadStatement(Exception):
    """Finding a statement's candidates failed on its filter or sort: that statement's write error."""

    def __init__(self, error: MongoError) -> None:
        super().__init__(str(error))
        self.error = error


def result_reply(result: WriteResult, *, update: bool = False) -> dict[str, Any]:
    reply: dict[str, Any] = {"n": result.n}
    if update:
        reply["nModified"] = result.n_modified
        if result.upserted:
            reply["upserted"] = result.upserted
    if result.write_errors:
        reply["writeErrors"] = result.write_errors
    reply["ok"] = 1.0
    return reply


def _result_of_reply(reply: dict[str, Any]) -> WriteResult:
    return WriteResult(n=int(reply.get("n", 0)), n_modified=int(reply.get("nModified", 0)),
                       upserted=list(reply.get("upserted", [])), write_errors=list(reply.get("writeErrors", [])))


def _merged(base: WriteResult, part: WriteResult, offset: int) -> WriteResult:
    """`base` plus the result of statements `offset`.. (their indexes made the batch's)."""
    return WriteResult(
        base.n + part.n, base.n_modified + part.n_modified,
        base.upserted + [dict(u, index=u["index"] + offset) for u in part.upserted],
        base.write_errors + [dict(e, index=e["index"] + offset) for e in part.write_errors])


def scans(statement: Any) -> bool:
    """Whether an update or delete statement must scan: its filter is not an `_id` equality."""
    query = statement.get("q") if isinstance(statement, dict) else None
    return isinstance(query, dict) and not id_equality(query)[0]


async def find_candidates(ctx: CommandContext, ns: str, query: dict[str, Any], sort: Any,
                          first_only: bool, limit: TimeLimit | None = None,
                          collation: Collation | None = None) -> list[Any]:
    """The `_id`s of the documents of `ns` matching `query` (in `sort` order, under `collation`),
    found on the query pool."""
    matcher = collated_matcher(query, collation)
    source = time_checked(ctx.node.store.any_thread_reader.scan(ns))
    if not sort:
        sort = natural_order(ctx.node.store.reader.collection(ns))

    def find() -> list[Any]:
        matching = ((doc if collation is None else collation.sort_form(doc), doc["_id"])
                    for doc in source if matcher.matches(doc))
        ordered = sort_payloads(matching, sort) if isinstance(sort, dict) and sort else (i for _, i in matching)
        if first_only:
            first = next(iter(ordered), _NONE)
            return [] if first is _NONE else [first]
        return list(ordered)

    return await ctx.node.queries.run(find, limit)


_NONE = object()


@dataclass
class _Batch:
    ctx: CommandContext
    ns: str
    statements: list[Any]
    ordered: bool
    perform: Perform
    is_update: bool
    rw: sessions.RetryableWrite | None
    # Statements evaluate expressions ($expr, pipeline updates): their commits run off the event loop.
    evaluates: bool = False
    total: WriteResult = field(default_factory=WriteResult)
    optime: OpTime | None = None
    stopped: bool = False
    commits: int = 0
    time_limit: TimeLimit = field(default_factory=TimeLimit)
    flush: bool = False   # the write concern waits on durability: the journal flush starts at commit

    async def candidates(self, spec: dict[str, Any], sort: Any, first_only: bool) -> list[Any]:
        try:
            return await find_candidates(self.ctx, self.ns, spec["q"], sort, first_only, self.time_limit,
                                         parse_collation(spec.get("collation")))
        except MongoError as err:
            if err.code == 50:
                raise  # out of time: the command fails
            raise _BadStatement(err) from None

    async def commit(self, start: int, chunk: list[Any], candidates: Candidates | None, end: int,
                     *, stale_if_unmatched: bool = False) -> WriteResult:
        """Runs statements `start`.. (`chunk`) in one group commit; `end`: how many statements of the batch
        are done once it commits (`start` for a slice of a multi statement that goes on). Returns what
        the chunk did."""
        if self.commits and (point := self.ctx.node.failpoints.check("failBatchWriteSlice")) is not None:
            raise MongoError(int(point.data.get("errorCode", 91)), "failBatchWriteSlice fail point")
        rw, base = self.rw, self.total

        def fn(env: WriteEnv) -> tuple[str, WriteResult, WriteResult, OpTime | None]:
            nonlocal base
            env.bypass_validation = bool(self.ctx.cmd.get("bypassDocumentValidation"))
            if rw is not None:
                seen = sessions.recorded(env, rw)
                if seen.stored is not None:
                    return "complete", _result_of_reply(seen.stored), WriteResult(), None
                progress = seen.progress
                if progress is not None:
                    done, partial = progress
                    if done >= end and (end > start or done > start):
                        return "skipped", _result_of_reply(partial), WriteResult(), None
                    base = _result_of_reply(partial)
                sessions.begin(env, rw)
            part = self.perform(env, self.ns, chunk, self.ordered, candidates)
            if stale_if_unmatched and part.n == 0 and not part.write_errors:
                raise StaleCandidates()
            merged = _merged(base, part, start)
            last = end >= len(self.statements) or (self.ordered and bool(part.write_errors))
            if rw is not None and end > start:
                # (A slice of a multi statement that goes on records nothing: a retry runs that statement
                # again from its start, on the results as they stood before it.)
                sessions.record(env, rw, result_reply(merged, update=self.is_update), done=None if last else end)
            entry = env.last_entry
            return "ran", merged, part, OpTime.from_document(entry) if entry and "ts" in entry else None

        outcome, self.total, part, optime = await self.ctx.node.submit_write(fn, durable=False, flush=self.flush,
                                                                             off_loop=self.evaluates)
        self.commits += 1
        self.optime = optime or self.optime
        self.stopped = outcome == "complete" or (self.ordered and bool(self.total.write_errors))
        return part

    async def scanning_statement(self, i: int) -> None:
        spec = self.statements[i]
        multi = bool(spec.get("multi")) if self.is_update else spec.get("limit") == 0
        try:
            if multi:
                await self._multi(i, spec)
            else:
                await self._single(i, spec)
        except _BadStatement as bad:
            # Finding the candidates failed (a bad filter or sort): the statement's write error.
            self.total = _merged(self.total, WriteResult(write_errors=[error_doc(0, bad.error)]), i)
            self.stopped = self.ordered

    async def _single(self, i: int, spec: dict[str, Any]) -> None:
        no_upsert = {**spec, "upsert": False}
        for _attempt in range(CANDIDATE_RETRIES):
            ids = await self.candidates(spec, spec.get("sort"), first_only=True)
            if not ids:
                await self.commit(i, [spec], {0: []}, i + 1)  # nothing matches: an upsert inserts
                return
            try:
                await self.commit(i, [no_upsert], {0: ids}, i + 1, stale_if_unmatched=True)
                return
            except StaleCandidates:
                continue
        await self.commit(i, [spec], None, i + 1)  # contended: scan in the transaction

    async def _multi(self, i: int, spec: dict[str, Any]) -> None:
        ids = await self.candidates(spec, None, first_only=False)
        upsert = bool(spec.get("upsert"))
        slices = [ids[k:k + MULTI_SLICE] for k in range(0, len(ids), MULTI_SLICE)] or [[]]
        matched = 0
        body = {**spec, "upsert": False}
        for k, id_slice in enumerate(slices):
            finishes = k == len(slices) - 1 and not upsert
            part = await self.commit(i, [body], {0: id_slice}, i + 1 if finishes else i)
            matched += part.n
            if self.stopped or part.write_errors:
                return  # a statement stops at its first error, ordered batch or not
        if upsert:
            await self.commit(i, [spec if matched == 0 else body], {0: []}, i + 1)


def _max_time_ms(cmd: dict[str, Any]) -> int:
    value = cmd.get("maxTimeMS")
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


async def run_batch(ctx: CommandContext, ns: str, statements: list[Any], ordered: bool, perform: Perform,
                    *, is_update: bool = False, scanning: bool = False) -> dict[str, Any]:
    """Runs an insert, update or delete command's statements (see the module's docstring) and waits
    for its write concern. `scanning`: update/delete statements whose filters may need a scan."""
    wc = parse_write_concern(ctx.cmd.get("writeConcern"))
    # `local` is not replicated, so neither is a retry record of a write to it (and none is kept).
    rw = None if ctx.db == "local" else sessions.retryable_write(ctx.cmd)
    batch = _Batch(ctx, ns, statements, ordered, perform, is_update, rw,
                   evaluates=scanning and any(statement_evaluates_expressions(s) for s in statements),
                   time_limit=TimeLimit.from_max_time_ms(_max_time_ms(ctx.cmd)), flush=wc.waits_for_journal)
    i, n = 0, len(statements)
    while i < n and not batch.stopped:
        if scanning and scans(statements[i]):
            await batch.scanning_statement(i)
            i += 1
            continue
        j = i + 1
        while j < n and j - i < WRITE_SLICE and not (scanning and scans(statements[j])):
            j += 1
        await batch.commit(i, statements[i:j], None, j)
        i = j
    reply = result_reply(batch.total, update=is_update)
    wce = await ctx.node.wait_for_write_concern(wc, batch.optime or ctx.node.last_committed_optime)
    if wce is not None:
        reply["writeConcernError"] = write_concern_error_field(wce)
    return reply
