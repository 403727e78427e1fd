#!/bin/bash
set -e
sqlite3 /app/app.db <<'SQL'
BEGIN;
CREATE UNIQUE INDEX idx_users_email ON users(email);
ALTER TABLE users ADD COLUMN tier TEXT NOT NULL DEFAULT 'basic';
UPDATE users SET tier = CASE
    WHEN (SELECT COALESCE(SUM(amount_cents), 0) FROM orders WHERE orders.user_id = users.id) >= 100000 THEN 'gold'
    WHEN (SELECT COALESCE(SUM(amount_cents), 0) FROM orders WHERE orders.user_id = users.id) >= 20000 THEN 'silver'
    ELSE 'basic'
END;
COMMIT;
SQL
