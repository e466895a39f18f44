#!/usr/bin/env bash
# config/README.md, "See what the cache did": kvbust in front of its built-in mock, first_turn_prefix;
# two conversations of three turns in warmup, the same two in profiling, then two conversations
# that open with the same question, take turns and send no session header. Needs curl and jq.
set -euo pipefail
KV=${KV:-kvbust}
$KV serve --cache-bust first_turn_prefix --listen 127.0.0.1:18080 --admin-listen 127.0.0.1:19090 2> kvbust.log &
PID=$!
until curl -sf localhost:19090/readyz >/dev/null; do sleep 0.2; done
SYSTEM="You are the support assistant of Northwind Outfitters, a shop for camping gear. Answer in one short sentence. Tents can be returned within 30 days if unused; sleeping bags carry a five-year warranty; stoves carry two years; orders over 80 dollars ship free."
# say <phase> <session or ""> <name of the variable holding the messages> <next question or "">:
# one turn. With a next question it appends the reply and the question; without, it streams.
say() {
  local hdr=() reply
  local -n msgs=$3
  [ -n "$2" ] && hdr=(-H "x-correlation-id: $2")
  if [ -z "$4" ]; then
    jq -n --argjson m "$msgs" '{model:"kvbust-mock",max_tokens:8,messages:$m,stream:true}' |
      curl -s localhost:18080/v1/chat/completions -H 'content-type: application/json' -H "x-kvbust-phase: $1" "${hdr[@]}" -d @- > /dev/null
    return
  fi
  reply=$(jq -n --argjson m "$msgs" '{model:"kvbust-mock",max_tokens:8,messages:$m}' |
    curl -s localhost:18080/v1/chat/completions -H 'content-type: application/json' -H "x-kvbust-phase: $1" "${hdr[@]}" -d @- |
    jq -r '.choices[0].message.content')
  msgs=$(jq -n --argjson m "$msgs" --arg r "$reply" --arg n "$4" '$m + [{role:"assistant",content:$r},{role:"user",content:$n}]')
}
opening() { jq -n --arg s "$1" --arg q "$2" '[{role:"system",content:$s},{role:"user",content:$q}]'; }
NEXT=("Does that hold for sale items too?" "And for gift cards?" "")
conv() {  # conv <phase> <session or ""> <first question>: three turns
  local history next
  history=$(opening "$SYSTEM" "$3")
  for next in "${NEXT[@]}"; do say "$1" "$2" history "$next"; done
}
conv warmup w1 "Can I return a tent I used once?"
conv warmup w2 "How long is the stove warranty?"
conv profiling p1 "Can I return a tent I used once?"
conv profiling p2 "How long is the stove warranty?"
# Two conversations that open with the same question, taking turns, and send no session
# header: the first-user-turn fallback gives both one session key, and each turn after the
# first goes back to the other conversation's branch.
a=$(opening "$SYSTEM" "Do you ship to Canada?")
b=$(opening "$SYSTEM Reply in French." "Do you ship to Canada?")
for next in "${NEXT[@]}"; do say profiling "" a "$next"; say profiling "" b "$next"; done
echo "=== kvbust report"
$KV report --admin http://127.0.0.1:19090
$KV report --admin http://127.0.0.1:19090 --format html -o report.html
kill -TERM $PID; wait $PID || true
echo "=== breach lines"
grep 'isolation breach' kvbust.log | grep WARN | sed 's/^.*WARN //'
