"""Build /app/shop.db deterministically (no randomness: a fixed linear congruential sequence)."""

import sqlite3
import sys

CUSTOMERS = [
    (1, "Alice Moreau", "FR"),
    (2, "Bjorn Lund", "SE"),
    (3, "Chen Wei", "CN"),
    (4, "Maria Garcia", "ES"),
    (5, "Dmitri Volkov", "PL"),
    (6, "Emeka Obi", "NG"),
    (7, "Maria Garcia", "MX"),
    (8, "Farah Haddad", "JO"),
    (9, "Gustavo Lima", "BR"),
    (10, "Hana Sato", "JP"),
    (11, "Ivan Petrov", "BG"),
    (12, "Julia Novak", "CZ"),
    (13, "Kofi Mensah", "GH"),
    (14, "Lena Richter", "DE"),
]

# (customer_id, amount_cents, status): the orders that decide the ranking.
ANCHORS = [
    (8, 412_350, "paid"),
    (8, 98_000, "refunded"),
    (3, 377_500, "paid"),
    (3, 12_990, "paid"),
    (12, 301_000, "paid"),
    (12, 70_045, "paid"),
    (6, 250_000, "paid"),
    (6, 640_000, "cancelled"),   # a big cancelled order must not count
    (14, 199_999, "paid"),
    (14, 300_000, "refunded"),
    (4, 205_000, "paid"),        # the two Maria Garcias together would rank first
    (7, 214_000, "paid"),
]


def lcg(seed):
    while True:
        seed = (seed * 1103515245 + 12345) % 2**31
        yield seed


def main(path):
    db = sqlite3.connect(path)
    db.executescript(
        """
        CREATE TABLE customers (
            id INTEGER PRIMARY KEY,
            name TEXT NOT NULL,
            country TEXT NOT NULL
        );
        CREATE TABLE orders (
            id INTEGER PRIMARY KEY,
            customer_id INTEGER NOT NULL REFERENCES customers(id),
            amount_cents INTEGER NOT NULL,
            status TEXT NOT NULL CHECK (status IN ('paid', 'cancelled', 'refunded')),
            ordered_at TEXT NOT NULL
        );
        """
    )
    db.executemany("INSERT INTO customers VALUES (?, ?, ?)", CUSTOMERS)
    rows = list(ANCHORS)
    gen = lcg(20240601)
    statuses = ["paid"] * 6 + ["cancelled", "refunded"]
    for _ in range(150):
        customer = 1 + next(gen) % 13          # customer 14 (Lena) only has anchor orders
        amount = 500 + next(gen) % 9_500      # 5.00 .. 99.99
        status = statuses[next(gen) % len(statuses)]
        rows.append((customer, amount, status))
    # Interleave anchors with the filler so they are not all at the start.
    order = sorted(range(len(rows)), key=lambda i: next(gen))
    for n, i in enumerate(order, 1):
        cid, amount, status = rows[i]
        day = 1 + (n * 7) % 28
        month = 1 + (n * 5) % 12
        db.execute(
            "INSERT INTO orders VALUES (?, ?, ?, ?, ?)",
            (n, cid, amount, status, f"2024-{month:02d}-{day:02d}"),
        )
    db.commit()
    db.close()


if __name__ == "__main__":
    main(sys.argv[1])
