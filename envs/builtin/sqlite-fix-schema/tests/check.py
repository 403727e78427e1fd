"""Check the migrated /app/app.db against the expected schema and data kept in /tests.

The checks read a private copy of the database (and of its journal or WAL, if any), never the
agent's file itself, with a deadline on every statement: a database can hold triggers and views
that run for ever, and untrusted schema code may call only innocuous SQL functions.
"""

import json
import os
import sqlite3
import sys
import time

sys.path.insert(0, "/tests")
import verifykit as vk  # noqa: E402

DB = "/app/app.db"
ORIGINAL_COLUMNS = {  # name -> (type, notnull, pk)
    "id": ("INTEGER", 0, 1),
    "email": ("TEXT", 1, 0),
    "name": ("TEXT", 1, 0),
    "created_at": ("TEXT", 1, 0),
}
STATEMENT_TIMEOUT_S = 5


def private_copy():
    folder = vk.private_dir()
    copy = os.path.join(folder, "app.db")
    for suffix in ("", "-wal", "-journal"):
        if suffix and vk.lstat_output(DB + suffix) is None:
            continue
        with open(copy + suffix, "wb") as f:
            f.write(vk.read_output(DB + suffix, max_bytes=64 << 20))
    return copy


def connect(path):
    db = sqlite3.connect(f"file:{path}?mode=rw", uri=True)
    started = [time.monotonic()]
    # Every statement gets STATEMENT_TIMEOUT_S: the handler aborts it (OperationalError) after that.
    db.set_progress_handler(lambda: int(time.monotonic() - started[0] > STATEMENT_TIMEOUT_S), 10_000)
    db.execute("PRAGMA trusted_schema = OFF")

    def execute(sql, parameters=()):
        started[0] = time.monotonic()
        return db.execute(sql, parameters)

    return db, execute


def check():
    try:
        check_database()
    except sqlite3.DatabaseError as exc:  # "interrupted": a statement ran out of time
        raise vk.Failure(f"the database could not be checked: {exc}") from None


def check_database():
    with open("/tests/expected.json") as f:
        expected = json.load(f)
    db, execute = connect(private_copy())
    try:
        execute("SELECT 1 FROM users LIMIT 1")
    except sqlite3.Error as exc:
        raise vk.Failure(f"cannot open {DB}: {exc}") from None
    if execute("PRAGMA integrity_check").fetchone()[0] != "ok":
        raise vk.Failure("integrity_check failed")

    columns = {row[1]: row for row in execute("PRAGMA table_info(users)")}
    for name, (ctype, notnull, pk) in ORIGINAL_COLUMNS.items():
        col = columns.get(name)
        if col is None:
            raise vk.Failure(f"column users.{name} is missing")
        if (col[2].upper(), col[3], col[5]) != (ctype, notnull, pk):
            raise vk.Failure(f"column users.{name} changed: {col}")
    tier = columns.get("tier")
    if tier is None:
        raise vk.Failure("column users.tier is missing")
    if tier[2].upper() != "TEXT":
        raise vk.Failure(f"users.tier has type {tier[2]!r}, expected TEXT")
    if tier[3] != 1:
        raise vk.Failure("users.tier is not NOT NULL")

    indexes = {row[1]: row for row in execute("PRAGMA index_list(users)")}
    index = indexes.get("idx_users_email")
    if index is None:
        raise vk.Failure("index idx_users_email on users is missing")
    if index[2] != 1:
        raise vk.Failure("idx_users_email is not UNIQUE")
    if len(index) > 4 and index[4] != 0:
        raise vk.Failure("idx_users_email is a partial index")
    index_columns = [row[2] for row in execute("PRAGMA index_info(idx_users_email)")]
    if index_columns != ["email"]:
        raise vk.Failure(f"idx_users_email covers {index_columns}, expected ['email']")

    users = [list(r) for r in execute("SELECT id, email, name, created_at, tier FROM users ORDER BY id")]
    if users != expected["users"]:
        wrong = [(e, g) for e, g in zip(expected["users"], users) if e != g][:5]
        raise vk.Failure(f"users rows differ (expected {len(expected['users'])} rows, got {len(users)}); "
                         f"first differences: {wrong}")  # fmt: skip
    orders = [list(r) for r in execute("SELECT id, user_id, amount_cents, placed_at FROM orders ORDER BY id")]
    if orders != expected["orders"]:
        raise vk.Failure("the orders table was changed")

    # Behaviour: the default applies, NULL is refused, emails are unique (in the private copy).
    db.isolation_level = None
    execute("BEGIN")
    execute("INSERT INTO users (email, name, created_at) VALUES ('new.user@example.com', 'New User', "
            "'2024-09-01 00:00:00')")  # fmt: skip
    got = execute("SELECT tier FROM users WHERE email = 'new.user@example.com'").fetchone()[0]
    if got != "basic":
        raise vk.Failure(f"a user inserted without a tier gets {got!r}, expected 'basic'")
    for what, sql, parameters in (
        ("users.tier accepts NULL",
         "INSERT INTO users (email, name, created_at, tier) VALUES ('null.tier@example.com', 'N', '2024-09-01', NULL)",
         ()),
        ("a duplicate email was accepted",
         "INSERT INTO users (email, name, created_at) VALUES (?, 'Dup', '2024-09-01')", (expected["users"][0][1],)),
    ):  # fmt: skip
        try:
            execute(sql, parameters)
        except sqlite3.IntegrityError:
            continue
        raise vk.Failure(what)


vk.main(check, budget_s=45)
