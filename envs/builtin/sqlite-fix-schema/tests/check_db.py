"""Check the migrated /app/app.db against the expected schema and data kept in /tests."""

import json
import sqlite3
import sys

DB = "/app/app.db"
EXPECTED = json.load(open("/tests/expected.json"))
ORIGINAL_COLUMNS = {  # name -> (type, notnull, pk)
    "id": ("INTEGER", 0, 1),
    "email": ("TEXT", 1, 0),
    "name": ("TEXT", 1, 0),
    "created_at": ("TEXT", 1, 0),
}


def fail(why):
    print("FAIL:", why)
    sys.exit(1)


def main():
    try:
        db = sqlite3.connect(f"file:{DB}?mode=rw", uri=True)
        db.execute("SELECT 1 FROM users LIMIT 1")
    except sqlite3.Error as exc:
        fail(f"cannot open {DB}: {exc}")
    if db.execute("PRAGMA integrity_check").fetchone()[0] != "ok":
        fail("integrity_check failed")

    columns = {row[1]: row for row in db.execute("PRAGMA table_info(users)")}
    for name, (ctype, notnull, pk) in ORIGINAL_COLUMNS.items():
        col = columns.get(name)
        if col is None:
            fail(f"column users.{name} is missing")
        if (col[2].upper(), col[3], col[5]) != (ctype, notnull, pk):
            fail(f"column users.{name} changed: {col}")
    tier = columns.get("tier")
    if tier is None:
        fail("column users.tier is missing")
    if tier[2].upper() != "TEXT":
        fail(f"users.tier has type {tier[2]!r}, expected TEXT")
    if tier[3] != 1:
        fail("users.tier is not NOT NULL")

    indexes = {row[1]: row for row in db.execute("PRAGMA index_list(users)")}
    index = indexes.get("idx_users_email")
    if index is None:
        fail("index idx_users_email on users is missing")
    if index[2] != 1:
        fail("idx_users_email is not UNIQUE")
    if len(index) > 4 and index[4] != 0:
        fail("idx_users_email is a partial index")
    index_columns = [row[2] for row in db.execute("PRAGMA index_info(idx_users_email)")]
    if index_columns != ["email"]:
        fail(f"idx_users_email covers {index_columns}, expected ['email']")

    users = [list(r) for r in db.execute("SELECT id, email, name, created_at, tier FROM users ORDER BY id")]
    if users != EXPECTED["users"]:
        wrong = [(e, g) for e, g in zip(EXPECTED["users"], users) if e != g][:5]
        fail(f"users rows differ (expected {len(EXPECTED['users'])} rows, got {len(users)}); first differences: {wrong}")
    orders = [list(r) for r in db.execute("SELECT id, user_id, amount_cents, placed_at FROM orders ORDER BY id")]
    if orders != EXPECTED["orders"]:
        fail("the orders table was changed")

    # Behaviour: the default applies, NULL is refused, emails are unique. Rolled back afterwards.
    db.isolation_level = None
    db.execute("BEGIN")
    try:
        db.execute("INSERT INTO users (email, name, created_at) VALUES ('new.user@example.com', 'New User', '2024-09-01 00:00:00')")
        got = db.execute("SELECT tier FROM users WHERE email = 'new.user@example.com'").fetchone()[0]
        if got != "basic":
            fail(f"a user inserted without a tier gets {got!r}, expected 'basic'")
        try:
            db.execute("INSERT INTO users (email, name, created_at, tier) VALUES ('null.tier@example.com', 'N', '2024-09-01', NULL)")
        except sqlite3.IntegrityError:
            pass
        else:
            fail("users.tier accepts NULL")
        try:
            db.execute("INSERT INTO users (email, name, created_at) VALUES (?, 'Dup', '2024-09-01')", (EXPECTED["users"][0][1],))
        except sqlite3.IntegrityError:
            pass
        else:
            fail("a duplicate email was accepted")
    finally:
        db.execute("ROLLBACK")
    print("PASS")


if __name__ == "__main__":
    main()
