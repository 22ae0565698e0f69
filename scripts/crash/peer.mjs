// A chat app in its own process, for crash runs. It sends a stream of messages to its peer (and
// a few to an account that never connects), commits what it receives to its own SQLite inbox
// through the inbound durability hook, and appends what it did to a log file. It may be
// SIGKILLed at any moment and is restarted on the same files.
//
// Configuration: the JSON in CRASH_PEER (see crash-run.mjs). Stdout carries one JSON line per
// lifecycle step ({"ready"}, {"connected"}, {"quiesced"}, {"stopped"}, {"fatal"}); stdin takes
// "connected" (answer once the relay connection is up), "quiesce" (stop sending) and "stop"
// (stop sending, stop the Protocol, exit).
//
// Every other message carries an id of the app's own choosing, which is not a UUID: the
// recipient sees it under its wire id (scripts/crash/wire-id.mjs). The intent records it, so
// even a send a kill cut short can be matched with what arrived.
import { appendFileSync, existsSync, readFileSync } from 'node:fs'
import { createInterface } from 'node:readline'

import Database from 'better-sqlite3'

import { Protocol } from '../../js/index.js'
import { mulberry32 } from './rng.mjs'

const cfg = JSON.parse(process.env.CRASH_PEER)
const random = mulberry32(cfg.seed)
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))
const say = (obj) => process.stdout.write(`${JSON.stringify(obj)}\n`)

// One write(2) per record on an O_APPEND file: a SIGKILL leaves whole lines (the page cache
// outlives the process), at worst without the record being written at all.
const log = (record) => appendFileSync(cfg.log, `${JSON.stringify({ ...record, at: Date.now() })}\n`)

/** The highest sequence number this app ever announced, so a restart continues the stream. */
function lastSeq() {
  if (!existsSync(cfg.log)) return 0
  let max = 0
  for (const line of readFileSync(cfg.log, 'utf8').split('\n')) {
    if (!line.startsWith('{"t":"intent"')) continue
    max = Math.max(max, JSON.parse(line).seq)
  }
  return max
}

// The app's own store. WAL with synchronous=NORMAL survives a process kill, which is the fault
// these runs inject (a power cut would need FULL).
const inbox = new Database(cfg.inbox)
inbox.pragma('journal_mode = WAL')
inbox.pragma('synchronous = NORMAL')
inbox.exec(`
  CREATE TABLE IF NOT EXISTS inbox (
    chat TEXT NOT NULL, sender TEXT NOT NULL, message_id TEXT NOT NULL,
    content TEXT NOT NULL, received_at INTEGER NOT NULL,
    PRIMARY KEY (chat, sender, message_id));
  CREATE TABLE IF NOT EXISTS offers (
    chat TEXT NOT NULL, sender TEXT NOT NULL, message_id TEXT NOT NULL, n INTEGER NOT NULL,
    PRIMARY KEY (chat, sender, message_id));`)
const insert = inbox.prepare('INSERT OR IGNORE INTO inbox VALUES (?, ?, ?, ?, ?)')
// How often the hook was handed each message: redeliveries the dedup key absorbed.
const offered = inbox.prepare(
  'INSERT INTO offers VALUES (?, ?, ?, 1) ON CONFLICT (chat, sender, message_id) DO UPDATE SET n = n + 1',
)
const commitBatch = inbox.transaction((batch) => {
  const now = Date.now()
  for (const m of batch) {
    insert.run(m.chat, m.sender, m.messageId, String(m.content), now)
    offered.run(m.chat, m.sender, m.messageId)
  }
})

const protocol = new Protocol({
  appId: 'crash-run',
  storage: { path: cfg.storage },
  transports: { internet: { url: cfg.relayUrl, authToken: cfg.token } },
  reliability: { retry: { outboxMaxLifetimeMs: cfg.lifetimeMs, pendingMessageMaxLifetimeMs: cfg.lifetimeMs } },
  encryption: { enabled: cfg.encryption },
  // The pause after the commit widens the window in which a kill lands between the app's commit
  // and the hook's resolution: the batch must then come back, and the dedup key absorb it.
  inboundDurabilityHook: async (batch) => {
    commitBatch(batch)
    if (cfg.hookDelayMs > 0) await sleep(cfg.hookDelayMs * 2 * random())
  },
})

let connected = false
let onConnected = () => {}

protocol.onEvent((e) => {
  switch (e.type) {
    case 'identity_ready':
      return log({ t: 'identity', address: e.address })
    case 'internet_status_changed':
      connected = e.connected
      log({ t: 'connection', connected })
      if (connected) onConnected()
      return undefined
    case 'message_delivered':
      return log({ t: 'delivered', id: e.messageId, replayed: e.replayed === true })
    case 'message_failed':
      return log({ t: 'failed', id: e.messageId, reason: e.reason, replayed: e.replayed === true })
    case 'message_received':
      return log({ t: 'received', id: e.messageId, chat: e.chat, sender: e.sender })
    case 'internet_session_superseded':
      return log({ t: 'superseded', reason: e.reason })
    case 'message_decryption_failed':
      return log({ t: 'undecryptable', id: e.messageId, code: e.code, reason: e.reason })
    case 'security_warning':
      return log({ t: 'security_warning', code: e.reasonCode, reason: e.reason })
    case 'diagnostic':
      if (e.level === 'error') log({ t: 'error', message: e.message, target: e.target })
      return undefined
    default:
      return undefined
  }
})

let seq = lastSeq()
let sending = cfg.send
/** Every priority in turn: a rule that drops one priority's ACKs fails the liveness check. */
const PRIORITIES = ['low', 'medium', 'high', 'critical']

/** Bursts of 1–3 concurrent sends (they share one commit), then a pause. */
async function sendStream() {
  while (sending) {
    const burst = []
    for (let n = 1 + Math.floor(random() * 3); n > 0; n--) {
      const s = ++seq
      const to = random() < cfg.ghostShare ? cfg.ghost : cfg.peer
      const id = s % 2 === 0 ? `${cfg.name}-${s}` : undefined
      // Logged before the call: a kill during sendMessage leaves an intent without its outcome
      // (and, for a minted id, without the id), and the verifier then looks for the message in
      // storage instead of trusting the log.
      log({ t: 'intent', seq: s, to, ...(id && { id }) })
      burst.push(
        protocol.sendMessage(to, `${cfg.name}:${s}`, { id, priority: PRIORITIES[s % 4], metadata: { seq: String(s) } }).then(
          (id) => log({ t: 'sent', seq: s, id, to }),
          (e) => log({ t: 'send_error', seq: s, code: e.code, message: e.message }),
        ),
      )
    }
    await Promise.all(burst)
    await sleep(cfg.pauseMs * 2 * random())
  }
}

log({ t: 'start', pid: process.pid, send: cfg.send })
try {
  await protocol.start()
} catch (e) {
  log({ t: 'start_error', code: e.code, message: e.message })
  say({ fatal: `${e.code}: ${e.message}` })
  process.exit(1)
}
log({ t: 'ready' })
say({ ready: true, address: protocol.localAddress() })
const stream = sendStream()

const rl = createInterface({ input: process.stdin })
rl.on('line', async (line) => {
  if (line === 'connected') {
    if (!connected) await new Promise((resolve) => (onConnected = resolve))
    say({ connected: true })
  } else if (line === 'quiesce') {
    sending = false
    await stream
    say({ quiesced: true })
  } else if (line === 'stop') {
    sending = false
    await stream
    await protocol.stop()
    inbox.close()
    log({ t: 'stopped' })
    say({ stopped: true })
    rl.close()
    process.stdin.destroy()
  }
})
