#!/bin/bash
cd /app
nohup python3 /app/kv_server.py --port 8080 > /tmp/kv_server.log 2>&1 < /dev/null &
# Wait until the server answers before using it.
for _ in $(seq 1 50); do
  if curl -fsS http://127.0.0.1:8080/health > /dev/null 2>&1; then break; fi
  sleep 0.1
done
curl -fsS -X PUT --data-binary 'hello snapgym' http://127.0.0.1:8080/kv/greeting
curl -fsS http://127.0.0.1:8080/kv/greeting; echo
