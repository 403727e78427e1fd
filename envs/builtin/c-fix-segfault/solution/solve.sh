#!/bin/bash
# Reference fix (solution/wordcount.patch): bounds-checked growing word buffer, room for the
# terminating NUL, the last word counted at EOF, argument and fopen checks, and "(none)" for files
# without words.
set -e
cd /app
patch -s wordcount.c < /solution/wordcount.patch
make
