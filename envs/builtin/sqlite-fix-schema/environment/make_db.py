"""Build /app/app.db deterministically (a fixed linear congruential sequence, no randomness)."""

import sqlite3
import sys

FIRST = ["ana", "ben", "cara", "dev", "eli", "fay", "gil", "hao", "ines", "jon"]
LAST = ["ito", "khan", "lopez", "moss", "ng", "ortiz", "park", "quinn"]

# user id -> exact order amounts, for the users sitting on the tier boundaries.
FIXED = {
    3: [100_000],                 # exactly the gold threshold
    7: [60_000, 39_999],          # one cent short of gold
    11: [20_000],                 # exactly the silver threshold
    15: [10_000, 9_999],          # one cent short of silver
    19: [4_000] * 26,             # many small orders adding up to gold
    23: [150_000],                # one big order
    27: [],                       # no orders at all
    31: [19_999, 1],              # reaches silver only with the second order
}


def lcg(seed):
    while True:
        seed = (seed * 1103515245 + 12345) % 2**31
        yield seed


def main(path):
    gen = lcg(777)
    db = sqlite3.connect(path)
    db.executescript(
        """
        CREATE TABLE users (
            id INTEGER PRIMARY KEY,
            email TEXT NOT NULL,
            name TEXT NOT NULL,
            created_at TEXT NOT NULL
        );
        CREATE TABLE orders (
            id INTEGER PRIMARY KEY,
            user_id INTEGER NOT NULL REFERENCES users(id),
            amount_cents INTEGER NOT NULL,
            placed_at TEXT NOT NULL
        );
        """
    )
    for uid in range(1, 41):
        first = FIRST[uid % len(FIRST)]
        last = LAST[(uid * 3) % len(LAST)]
        db.execute(
            "INSERT INTO users VALUES (?, ?, ?, ?)",
            (uid, f"{first}.{last}{uid}@example.com", f"{first.title()} {last.title()}",
             f"2023-{1 + uid % 12:02d}-{1 + uid % 28:02d} 08:{uid:02d}:00"),
        )
    orders = []
    for uid in range(1, 41):
        if uid in FIXED:
            orders += [(uid, amount) for amount in FIXED[uid]]
            continue
        if uid % 9 == 0:
            continue  # a few more users without orders
        for _ in range(next(gen) % 6):
            orders.append((uid, 1_000 + next(gen) % 45_000))
    orders.sort(key=lambda o: next(gen))
    for n, (uid, amount) in enumerate(orders, 1):
        db.execute(
            "INSERT INTO orders VALUES (?, ?, ?, ?)",
            (n, uid, amount, f"2024-{1 + n % 12:02d}-{1 + n % 28:02d}"),
        )
    db.commit()
    db.close()


if __name__ == "__main__":
    main(sys.argv[1])
