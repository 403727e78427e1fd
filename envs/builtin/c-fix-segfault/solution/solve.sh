#!/bin/bash
# Reference fix: bounds-checked growing word buffer, room for the terminating NUL, the last
# word counted at EOF, argument and fopen checks, and "(none)" for files without words.
set -e
cp /solution/wordcount.c /app/wordcount.c
cd /app
make
