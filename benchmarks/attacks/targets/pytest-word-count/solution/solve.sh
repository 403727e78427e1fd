#!/bin/bash
grep -ciw snapshot /app/words.txt > /app/answer.txt
