#!/bin/bash
awk '{ split($0, p, "\""); split(p[3], f, " "); if (f[1] ~ /^5/) n++ } END { print n+0 }' /app/access.log > /app/answer.txt
