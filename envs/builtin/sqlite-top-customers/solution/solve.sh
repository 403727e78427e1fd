#!/bin/bash
set -e
sqlite3 /app/shop.db "
SELECT c.name
FROM customers AS c
JOIN orders AS o ON o.customer_id = c.id
WHERE o.status = 'paid'
GROUP BY c.id
ORDER BY SUM(o.amount_cents) DESC
LIMIT 3;" > /app/top.txt
