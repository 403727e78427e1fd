#!/bin/bash
set -e
cat > /app/Makefile <<'MAKE'
CC = gcc
CFLAGS = -Wall -O2
LDLIBS = -lm

OBJS = main.o lexer.o eval.o

calc: $(OBJS)
	$(CC) $(CFLAGS) -o $@ $(OBJS) $(LDLIBS)

%.o: %.c calc.h
	$(CC) $(CFLAGS) -c -o $@ $<

clean:
	rm -f calc $(OBJS)

.PHONY: clean
MAKE
cd /app
make
