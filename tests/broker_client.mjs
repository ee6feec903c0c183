// A Node.js service using novaque's broker with nothing but the built-in fetch:
// publish, long-poll, settle (complete, abandon, dead_letter), as another
// language's user would. Run by tests/test_broker.py:
//   node tests/broker_client.mjs BASE_URL TOKEN
// Prints "ok" last, or exits 1 saying what went wrong.

const [base, token] = process.argv.slice(2);
const channel = `${base}/v1/topics/orders/channels/billing`;

async function call(method, url, body) {
  const answer = await fetch(url, {
    method,
    headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await answer.text();
  return { status: answer.status, json: text ? JSON.parse(text) : null };
}

function check(condition, what) {
  if (!condition) {
    console.error(`failed: ${what}`);
    process.exit(1);
  }
}

// A long poll that waits for a message published after it started.
const started = Date.now();
const polling = call("POST", `${channel}/receive`, { wait: 15, max_messages: 10 });
await new Promise((resolve) => setTimeout(resolve, 300));
const published = await call("POST", `${base}/v1/topics/orders/messages`, {
  messages: [
    { body: "order 1", headers: { source: "node" } },
    { body_b64: Buffer.from([0, 255]).toString("base64") },
    { body: "order 3", group: "eu" },
  ],
});
check(published.status === 201 && published.json.ids.length === 3, `publish: ${JSON.stringify(published)}`);
const first = await polling;
check(first.status === 200, `receive: ${JSON.stringify(first)}`);
check(Date.now() - started < 10000, "the long poll answered late");
let messages = first.json.messages;
// The poll may have been answered by the first delivery alone: take the rest.
while (messages.length < 3) {
  const more = await call("POST", `${channel}/receive`, { wait: 5, max_messages: 10 });
  check(more.status === 200 && more.json.messages.length > 0, "the rest of the messages");
  messages = messages.concat(more.json.messages);
}
const [one, two, three] = messages.sort((a, b) => a.id - b.id);
check(one.body === "order 1" && one.headers.source === "node", "text body and headers");
check(!("body" in two) && Buffer.from(two.body_b64, "base64").equals(Buffer.from([0, 255])), "bytes");
check(three.group === "eu" && three.attempts === 1, "group and attempts");
check(!Number.isNaN(Date.parse(one.lease_expires_at)), "ISO 8601 times");

const settled = await call("POST", `${channel}/settle`, {
  items: [
    { delivery_id: one.delivery_id, lease_token: one.lease_token, action: "complete" },
    { delivery_id: two.delivery_id, lease_token: two.lease_token, action: "abandon", delay: 0, error: "retry me" },
    { delivery_id: three.delivery_id, lease_token: three.lease_token, action: "dead_letter", reason: "bad" },
  ],
});
check(settled.status === 200 && settled.json.results.every((r) => r.ok), `settle: ${JSON.stringify(settled)}`);

// The abandoned one comes back; complete it. Settling a stale token: lease_lost.
const again = await call("POST", `${channel}/receive`, { wait: 5 });
check(again.json.messages.length === 1 && again.json.messages[0].attempts === 2, "retry");
const retry = again.json.messages[0];
const done = await call("POST", `${channel}/settle`, {
  items: [{ delivery_id: retry.delivery_id, lease_token: retry.lease_token, action: "complete" }],
});
check(done.json.results[0].ok === true, "complete the retry");
const stale = await call("POST", `${channel}/settle`, {
  items: [{ delivery_id: one.delivery_id, lease_token: one.lease_token, action: "complete" }],
});
check(stale.json.results[0].error === "lease_lost", "a stale token is lease_lost");

// Errors are JSON with a code.
const bad = await call("POST", `${channel}/receive`, { wait: 99 });
check(bad.status === 400 && bad.json.error.code === "invalid", "invalid wait");
const state = await call("GET", channel);
check(state.status === 200 && state.json.backlog.dead === 1, "channel state");
console.log("ok");
