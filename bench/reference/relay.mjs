// The reference relay of `bench/compare.mjs`: what a Node developer writes instead of a journaled
// relay. It speaks the frames of docs/protocol.md on the path the benchmark measures —
// `Authenticate` (the same HS256 tokens as `issueToken`), `SendMessage` answered
// `MessageSent{disposition:"live"}` with a `MessageReceived` to the recipient, `Ack`/`AckUpTo`
// accepted and ignored — and keeps nothing: no journal, no mailbox, no durability. A recipient
// that is not connected is unreachable.
//
//   node bench/reference/relay.mjs --jwt-secret-file FILE
//
// Listens on 127.0.0.1 on an ephemeral port and prints its URL as the first line on stdout.
// Stops on SIGINT / SIGTERM.
import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto'
import { readFileSync } from 'node:fs'

import { WebSocketServer } from 'ws'

const MAX_FRAME = 1 << 20
const MAX_ID_BYTES = 256
// docs/protocol.md, Transport: ping every 10 s, drop a peer silent for 30 s.
const PING_MS = 10_000
const SILENT_MS = 30_000
const AUTH_TIMEOUT_MS = 10_000

const args = process.argv.slice(2)
const secretFile = args[args.indexOf('--jwt-secret-file') + 1]
if (!args.includes('--jwt-secret-file') || !secretFile) {
  process.stderr.write('usage: node bench/reference/relay.mjs --jwt-secret-file FILE\n')
  process.exit(2)
}
const secret = readFileSync(secretFile, 'utf8').replace(/\r?\n$/, '')

class AuthError extends Error {}

const fromBase64url = (part) => JSON.parse(Buffer.from(part, 'base64url').toString('utf8'))

// docs/protocol.md, Token: HS256 only, constant-time MAC check, `exp` required, `nbf` honoured,
// `sub` an account name.
function verifyToken(token) {
  const parts = typeof token === 'string' ? token.split('.') : []
  if (parts.length !== 3) throw new AuthError('invalid_token')
  let header
  let claims
  try {
    header = fromBase64url(parts[0])
    claims = fromBase64url(parts[1])
  } catch {
    throw new AuthError('invalid_token')
  }
  if (header?.alg !== 'HS256') throw new AuthError('invalid_token')
  const mac = createHmac('sha256', secret).update(`${parts[0]}.${parts[1]}`).digest()
  const signature = Buffer.from(parts[2], 'base64url')
  if (signature.length !== mac.length || !timingSafeEqual(signature, mac)) throw new AuthError('invalid_token')
  const now = Date.now() / 1000
  if (typeof claims.exp !== 'number') throw new AuthError('invalid_token')
  if (claims.exp <= now) throw new AuthError('token_expired')
  if (typeof claims.nbf === 'number' && claims.nbf > now) throw new AuthError('token_not_yet_valid')
  const sub = claims.sub
  if (!isIdentifier(sub) || sub.toLowerCase().startsWith('off1') || /[\u0000-\u001f\u007f/\\:]/.test(sub) || sub === '.' || sub === '..') {
    throw new AuthError('invalid_account')
  }
  return sub
}

const isIdentifier = (value) => typeof value === 'string' && value.length > 0 && Buffer.byteLength(value) <= MAX_ID_BYTES

/** Account → its one authenticated connection. */
const online = new Map()
/** Accounts that have authenticated at least once: the known recipients. */
const known = new Set()
/** Connection → keepalive pings it has not answered. */
const unanswered = new WeakMap()

const wss = new WebSocketServer({ host: '127.0.0.1', port: 0, perMessageDeflate: false, maxPayload: MAX_FRAME })

wss.on('connection', (ws) => {
  let account = null
  unanswered.set(ws, 0)
  const authTimer = setTimeout(() => refuse('auth_timeout'), AUTH_TIMEOUT_MS)
  const send = (frame) => ws.send(JSON.stringify(frame))
  const refuse = (reason) => {
    send({ type: 'AuthError', reason })
    ws.close(4001)
  }
  ws.on('pong', () => unanswered.set(ws, 0))
  ws.on('message', (data, isBinary) => {
    let frame = null
    if (!isBinary) {
      try {
        frame = JSON.parse(data)
      } catch {}
    }
    const malformed = frame === null || typeof frame !== 'object' || Array.isArray(frame) || typeof frame.type !== 'string'
    if (account === null) {
      clearTimeout(authTimer)
      if (malformed || frame.type !== 'Authenticate') return refuse('not_authenticated')
      try {
        account = verifyToken(frame.token)
      } catch (e) {
        if (e instanceof AuthError) return refuse(e.message)
        throw e
      }
      // docs/protocol.md, Session displacement: one connection per account.
      const previous = online.get(account)
      if (previous) {
        previous.send(JSON.stringify({ type: 'SessionSuperseded', reason: 'new_session' }))
        previous.close(4000)
      }
      online.set(account, ws)
      known.add(account)
      send({
        type: 'Authenticated',
        user_id: account,
        username: account,
        capabilities: [],
        address_challenge: randomBytes(32).toString('base64'),
      })
      return
    }
    if (malformed) return send({ type: 'Error', code: 'malformed' })
    switch (frame.type) {
      case 'SendMessage': {
        const { recipient, content, message_id: messageId } = frame
        if (!isIdentifier(recipient) || typeof content !== 'string' || !isIdentifier(messageId)) {
          return send({ type: 'Error', code: 'invalid_frame', frame_type: 'SendMessage', message_id: isIdentifier(messageId) ? messageId : undefined })
        }
        const to = online.get(recipient)
        if (to === undefined) {
          const reason = known.has(recipient) ? 'offline_no_mailbox' : 'unknown_recipient'
          return send({ type: 'DeliveryError', message_id: messageId, recipient, reason: `recipient_unreachable: ${reason}` })
        }
        const timestamp = Date.now()
        to.send(
          JSON.stringify({
            type: 'MessageReceived',
            sender: account,
            sender_account: account,
            content,
            message_id: messageId,
            timestamp,
            reply_to_msg: frame.reply_to_msg ?? null,
          }),
        )
        return send({ type: 'MessageSent', message_id: messageId, recipient, timestamp, disposition: 'live' })
      }
      // Nothing is journaled, so there is nothing to release.
      case 'Ack':
      case 'AckUpTo':
        return
      case 'Authenticate':
        return send({ type: 'Error', code: 'already_authenticated', frame_type: 'Authenticate' })
      default:
        return send({ type: 'Error', code: 'unknown_type', frame_type: frame.type.slice(0, 128) })
    }
  })
  ws.on('close', () => {
    clearTimeout(authTimer)
    if (account !== null && online.get(account) === ws) online.delete(account)
  })
  ws.on('error', () => {})
})

// A peer answers pings; one that has answered none of the last three is dropped.
const keepalive = setInterval(() => {
  for (const ws of wss.clients) {
    const missed = unanswered.get(ws)
    if (missed * PING_MS >= SILENT_MS) ws.terminate()
    else {
      unanswered.set(ws, missed + 1)
      ws.ping()
    }
  }
}, PING_MS)

const stop = () => {
  clearInterval(keepalive)
  for (const ws of wss.clients) ws.terminate()
  wss.close(() => process.exit(0))
}
process.once('SIGINT', stop)
process.once('SIGTERM', stop)

wss.on('listening', () => process.stdout.write(`ws://127.0.0.1:${wss.address().port}\n`))
