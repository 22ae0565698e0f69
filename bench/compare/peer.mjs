// One process of `bench/compare.mjs`: the senders, the recipients, or the accepting client of one
// side, so that each role's CPU is its own process's. Forked with one JSON argument
// `{ role, kind, url, dir, pairs, tokens }` and driven over IPC: it answers `{ ready }` once
// set up (connected, for a sender or recipient), then `{ result }` to each `{ cmd }`.
//
// kind `ours`: the package's `Protocol`, one per account, each with its own store.
// kind `ref`: the hand-written outbox (bench/reference/outbox.mjs), one tick-batched database per
//   process shared by its clients, as one Node process would have.
// kind `plain`: the same client with everything in memory.
import { mkdirSync } from 'node:fs'
import { join } from 'node:path'
import { performance } from 'node:perf_hooks'

const { role, kind, url, dir, pairs, tokens } = JSON.parse(process.argv[2])
const recipientOf = (i) => `r${i}`

// Plaintext is what this benchmark measures; the warning that says so is not news here.
process.removeAllListeners('warning')
process.on('warning', (w) => {
  if (w.name !== 'OfflineCourierConfigWarning') process.stderr.write(`${w.stack}\n`)
})

// A parent that is gone takes this process along.
process.on('disconnect', () => process.exit(0))
mkdirSync(dir, { recursive: true })

/**
 * Sends as `account` (to `recipientOf`) or receives. `settled(id, delivered)` reports a send's
 * end: its ACK arrived, or (ours only) the outbox, full, gave it up.
 */
async function ourEndpoint(account, token, settled) {
  // Each side loads only its own code: the reference processes do not carry the addon, nor ours
  // better-sqlite3.
  const { Protocol } = await import('../../js/index.js')
  const p = new Protocol({
    appId: 'bench',
    storage: { path: join(dir, `${role}-${account}.db`) },
    transports: url ? { internet: { url, authToken: token } } : undefined,
    encryption: { enabled: false },
  })
  // Without a relay nothing listens, as in bench/e2e.mjs: the outbox holds 500 entries
  // (docs/delivery.md, Outbox capacity), so a long run of accepts settles the oldest as failed.
  const authenticated = url
    ? new Promise((resolve) => {
        p.onEvent((e) => {
          if (e.type === 'message_delivered') settled(e.messageId, true)
          else if (e.type === 'message_failed' && e.reason === 'Outbox capacity exceeded') settled(e.messageId, false)
          else if (e.type === 'message_failed') fail(new Error(`message failed: ${e.reason}`))
          else if (e.type === 'internet_status_changed' && e.connected && e.authenticated) resolve()
        })
      })
    : undefined
  await p.start()
  await authenticated
  return { send: (to, text) => p.sendMessage(to, text), close: () => p.stop() }
}

let sharedStore = null
async function referenceEndpoint(account, token, settled) {
  const { Client, TickStore } = await import('../reference/outbox.mjs')
  if (kind === 'ref' && sharedStore === null) sharedStore = new TickStore(join(dir, `${role}.db`))
  const client = new Client({ account, store: kind === 'ref' ? sharedStore : null, url, token, onDelivered: (id) => settled(id, true) })
  if (url) await client.connect()
  return { send: (to, text) => client.send(to, text), close: () => client.close() }
}

function fail(e) {
  process.send({ error: e.stack ?? String(e) }, () => process.exit(1))
}

/** One sender and what it has in flight; latencies from the send call to the ACK, in ms. */
class Pair {
  constructor(index) {
    this.to = recipientOf(index)
    this.sentAt = new Map()
    this.settledEarly = new Map()
    this.stats = { latencies: [], failed: 0 }
    this.onSettled = () => {}
  }

  send(endpoint, text) {
    const t0 = performance.now()
    endpoint.send(this.to, text).then((id) => {
      const early = this.settledEarly.get(id)
      if (early === undefined) this.sentAt.set(id, t0)
      else {
        this.settledEarly.delete(id)
        this.settle(early.delivered, early.at - t0)
      }
    }, fail)
  }

  // A send can settle before its accept's promise has handed over the id.
  settled(id, delivered) {
    const now = performance.now()
    const t0 = this.sentAt.get(id)
    if (t0 === undefined) this.settledEarly.set(id, { delivered, at: now })
    else {
      this.sentAt.delete(id)
      this.settle(delivered, now - t0)
    }
  }

  settle(delivered, ms) {
    if (delivered) this.stats.latencies.push(ms)
    else this.stats.failed++
    this.onSettled()
  }
}

const percentile = (sorted, p) => sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))]

function summary(count, started, { latencies, failed }) {
  latencies.sort((a, b) => a - b)
  return { sent: count, count: count - failed, failed, seconds: (performance.now() - started) / 1000, p50: percentile(latencies, 50), p99: percentile(latencies, 99) }
}

/**
 * Each pair keeps `window` messages unacknowledged until `durationMs` has passed, then the ones in
 * flight are waited for. With `rate`, messages are offered at that total rate instead.
 */
function drive(endpoints, senders, { window, durationMs, rate, perPair }) {
  const stats = { latencies: [], failed: 0 }
  const started = performance.now()
  let issued = 0
  let settled = 0
  let open = true
  return new Promise((resolve) => {
    const finishIfDone = () => {
      if (!open && settled === issued) resolve(summary(issued, started, stats))
    }
    const close = () => {
      open = false
      finishIfDone()
    }
    const issue = (i) => {
      issued++
      senders[i].send(endpoints[i], `payload ${issued}`)
    }
    senders.forEach((pair, i) => {
      pair.stats = stats
      pair.onSettled = () => {
        settled++
        if (open && rate === undefined) {
          if (perPair !== undefined ? issued >= perPair * senders.length : performance.now() - started >= durationMs) open = false
          else issue(i)
        }
        finishIfDone()
      }
    })
    if (rate !== undefined) {
      const total = Math.round((rate * durationMs) / 1000)
      const pacer = setInterval(() => {
        const due = Math.min(total, Math.floor(((performance.now() - started) * rate) / 1000))
        while (issued < due) issue(issued % senders.length)
        if (issued === total) {
          clearInterval(pacer)
          close()
        }
      }, 1)
      return
    }
    for (let i = 0; i < senders.length; i++) for (let k = 0; k < Math.min(window, perPair ?? window); k++) issue(i)
    if (perPair === undefined) setTimeout(close, durationMs)
  })
}

/** Keeps `window` accepts outstanding until `count` have resolved. */
function accept(endpoint, count, window) {
  const started = performance.now()
  let issued = 0
  let done = 0
  return new Promise((resolve) => {
    const next = () => {
      while (issued < count && issued - done < window) {
        issued++
        endpoint.send('bob', `message ${issued}`).then(() => {
          done++
          if (done === count) resolve({ count, seconds: (performance.now() - started) / 1000 })
          else next()
        }, fail)
      }
    }
    next()
  })
}

const makeEndpoint = kind === 'ours' ? ourEndpoint : referenceEndpoint
let endpoints = []
let senders = []

try {
  if (role === 'accepts') {
    endpoints = [await makeEndpoint('alice', undefined, () => {})]
  } else if (role === 'senders') {
    senders = Array.from({ length: pairs }, (_, i) => new Pair(i))
    endpoints = await Promise.all(senders.map((pair, i) => makeEndpoint(`s${i}`, tokens[i], (id, delivered) => pair.settled(id, delivered))))
  } else {
    endpoints = await Promise.all(Array.from({ length: pairs }, (_, i) => makeEndpoint(recipientOf(i), tokens[i], () => {})))
  }
  process.send({ ready: true })
} catch (e) {
  fail(e)
}

process.on('message', async ({ cmd, ...params }) => {
  try {
    let result
    if (cmd === 'accept') result = await accept(endpoints[0], params.count, params.window)
    else if (cmd === 'drive') result = await drive(endpoints, senders, params)
    else if (cmd === 'stop') {
      await Promise.all(endpoints.map((e) => e.close()))
      sharedStore?.close()
      process.exit(0)
    } else throw new Error(`unknown command ${cmd}`)
    process.send({ result })
  } catch (e) {
    fail(e)
  }
})
