#!/bin/sh
mkdir -p /app
