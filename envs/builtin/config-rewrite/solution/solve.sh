#!/bin/bash
# Section-aware edits: track the current [section] and only touch keys inside the right one.
awk '
/^\[.*\]$/ { section = $0 }
section == "[server]"   && /^port[ \t]*=/      { print "port = 8443"; next }
section == "[server]"   && /^tls[ \t]*=/       { print "tls = true"; next }
section == "[cache]"    && /^enabled[ \t]*=/   { print "enabled = true"; next }
section == "[logging]"  && /^debug_sql[ \t]*=/ { next }
section == "[database]" && /^max_connections[ \t]*=/ { print; print "pool_size = 20"; next }
{ print }
' /app/app.conf > /tmp/app.conf.new && cat /tmp/app.conf.new > /app/app.conf && rm -f /tmp/app.conf.new
