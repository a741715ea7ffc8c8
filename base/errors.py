"""MongoDB error codes and the one exception type the data layer raises.

Every error a client can see carries a MongoDB code and code name so that real
drivers react correctly (retry, rediscover, raise the right exception class).
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

from typing import Any

CODE_NAMES: dict[int, str] = {
    1: "InternalError",
    2: "BadValue",
    4: "NoSuchKey",
    6: "HostUnreachable",
    7: "HostNotFound",
    9: "FailedToParse",
    10: "CannotMutateObject",
    11: "UserNotFound",
    12: "UnsupportedFormat",
    13: "Unauthorized",
    14: "TypeMismatch",
    15: "Overflow",
    16: "InvalidLength",
    17: "ProtocolError",
    18: "AuthenticationFailed",
    20: "IllegalOperation",
    22: "InvalidBSON",
    23: "AlreadyInitialized",
    24: "LockTimeout",
    26: "NamespaceNotFound",
    27: "IndexNotFound",
    28: "PathNotViable",
    31: "RoleNotFound",
    40: "ConflictingUpdateOperators",
    43: "CursorNotFound",
    47: "NoMatchingDocument",
    48: "NamespaceExists",
    50: "MaxTimeMSExpired",
    52: "DollarPrefixedFieldName",
    53: "InvalidIdField",
    54: "NotSingleValueField",
    55: "InvalidDBRef",
    56: "EmptyFieldName",
    57: "DottedFieldName",
    59: "CommandNotFound",
    63: "StaleShardVersion",
    64: "WriteConcernFailed",
    66: "ImmutableField",
    67: "CannotCreateIndex",
    68: "IndexAlreadyExists",
    72: "InvalidOptions",
    73: "InvalidNamespace",
    74: "NodeNotFound",
    79: "UnknownReplWriteConcern",
    85: "IndexOptionsConflict",
    86: "IndexKeySpecsConflict",
    89: "NetworkTimeout",
    91: "ShutdownInProgress",
    93: "InvalidReplicaSetConfig",
    94: "NotYetInitialized",
    95: "NotSecondary",
    96: "OperationFailed",
    100: "UnsatisfiableWriteConcern",
    103: "NewReplicaSetConfigurationIncompatible",
    112: "WriteConflict",
    115: "CommandNotSupported",
    117: "ConflictingOperationInProgress",
    121: "DocumentValidationFailure",
    125: "IndexBuildAborted",
    133: "FailedToSatisfyReadPreference",
    136: "CappedPositionLost",
    143: "CursorInUse",
    146: "ExceededMemoryLimit",
    150: "StaleEpoch",
    166: "CommandNotSupportedOnView",
    168: "InvalidPipelineOperator",
    175: "QueryPlanKilled",
    189: "PrimarySteppedDown",
    197: "InvalidIndexSpecificationOption",
    217: "IncompleteTransactionHistory",
    225: "TransactionTooOld",
    234: "RetryChangeStream",
    237: "CursorKilled",
    239: "SnapshotTooOld",
    246: "SnapshotUnavailable",
    251: "NoSuchTransaction",
    256: "TransactionCommitted",
    260: "InvalidResumeToken",
    261: "TooManyLogicalSessions",
    262: "ExceededTimeLimit",
    263: "OperationNotSupportedInTransaction",
    267: "PreparedTransactionInProgress",
    280: "ChangeStreamFatalError",
    286: "ChangeStreamHistoryLost",
    290: "TransactionExceededLifetimeLimitSeconds",
    292: "QueryExceededMemoryLimitNoDiskUseAllowed",
    9001: "SocketException",
    10107: "NotWritablePrimary",
    10334: "BSONObjectTooLarge",
    11000: "DuplicateKey",
    11600: "InterruptedAtShutdown",
    11601: "Interrupted",
    11602: "InterruptedDueToReplStateChange",
    13113: "Location13113",
    13388: "StaleConfig",
    13435: "NotPrimaryNoSecondaryOk",
    13436: "NotPrimaryOrSecondary",
    15952: "Location15952",
    17419: "Location17419",
    31368: "Location31368",
    40352: "Location40352",
    40353: "Location40353",
    40414: "Location40414",
    40600: "Location40600",
    40601: "Location40601",
    50768: "Location50768",
    51186: "Location51186",
    51764: "Location51764",
}

# Codes in MongoDB's RetriableError category: a retryable write that fails with one
# of these gets the RetryableWriteError label (drivers retry only on that label).
RETRYABLE_CODES = frozenset({6, 7, 89, 91, 189, 262, 9001, 10107, 11600, 11602, 13435, 13436})


class MongoError(Exception):
    """An error with a MongoDB code; becomes `{ok: 0, errmsg, code, codeName}`."""

    def __init__(self, code: int, errmsg: str, *, extra: dict[str, Any] | None = None) -> None:
        super().__init__(errmsg)
        self.code = code
        self.errmsg = errmsg
        self.extra = dict(extra or {})

    @property
    def code_name(self) -> str:
        return CODE_NAMES.get(self.code, f"Location{self.code}")

    def to_document(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"ok": 0.0, "errmsg": self.errmsg, "code": self.code, "codeName": self.code_name}
        doc.update(self.extra)
        return doc

    def __repr__(self) -> str:
        return f"MongoError({self.code}, {self.errmsg!r})"


def bad_value(msg: str) -> MongoError:
    return MongoError(2, msg)


def failed_to_parse(msg: str) -> MongoError:
    return MongoError(9, msg)


def type_mismatch(msg: str) -> MongoError:
    return MongoError(14, msg)
