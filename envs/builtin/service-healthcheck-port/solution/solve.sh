#!/bin/bash
cd /app
# The service reads SERVICE_PORT (the file only had PORT) and the bind address must exist here.
sed -i -e 's/^SERVICE_HOST=.*/SERVICE_HOST=127.0.0.1/' -e 's/^PORT=9090$/SERVICE_PORT=9090/' /app/service.env
grep -q '^SERVICE_PORT=9090$' /app/service.env || echo 'SERVICE_PORT=9090' >> /app/service.env
cat /app/service.env
nohup python3 /app/service.py > /tmp/service.log 2>&1 < /dev/null &
for _ in $(seq 1 50); do
  if curl -fsS http://127.0.0.1:9090/health > /dev/null 2>&1; then break; fi
  sleep 0.1
done
curl -fsS http://127.0.0.1:9090/health; echo
