// Compiled by `tsc --noEmit` in `npm test`: the typings must accept real usage and narrow events.
import {
  Gateway,
  Protocol,
  ProtocolError,
  Relay,
  issueToken,
  type AuthFailureReason,
  type ConnectionRequestUndeliverableEvent,
  type DecryptionFailureCode,
  type DiagnosticLevel,
  type ForwardInfo,
  type ForwardOptions,
  type GroupInfo,
  type GroupMemberStatus,
  type GroupMessageStatus,
  type IdentityReadyEvent,
  type InboundMessage,
  type MessageDeferredReason,
  type MessageDeliveredEvent,
  type MessageFailedEvent,
  type MessageFailedReason,
  type ProtocolEvent,
  type ProtocolEventOf,
  type Quote,
  type SecurityWarningReasonCode,
  type SendOptions,
  type Transport,
  type UndeliverableReasonCode,
} from '../../js/index.js'

async function main(): Promise<void> {
  const relay = await Relay.start({ listen: '127.0.0.1:0', storage: { memory: true }, jwtSecret: 's3cret-0123456789abcdef-0123456789' })
  const protocol = new Protocol({
    appId: 'chat',
    storage: { path: 'alice.db' },
    transports: { internet: { url: relay.url, authToken: issueToken('s3cret-0123456789abcdef-0123456789', 'alice') } },
    reliability: { ack: { defaultTimeoutMs: 5000 }, retry: { maxRetries: 5 } },
  })
  const off = protocol.onEvent((ev: ProtocolEvent) => {
    switch (ev.type) {
      case 'message_delivered': {
        const latency: number = ev.latencyMs
        const again: boolean = ev.replayed === true
        void latency
        void again
        break
      }
      case 'message_failed': {
        const reason: string = ev.reason
        void reason
        break
      }
      case 'message_received': {
        const body: string | Uint8Array = ev.content
        void body
        break
      }
      default:
        break
    }
  })
  await protocol.start()
  const id: string = await protocol.sendMessage('bob', 'hello', { priority: 'high', metadata: { k: 'v' } })
  const status = await protocol.getMessageStatus(id)
  if (status === 'delivered') off()
  const { sentence, facts } = await protocol.explainMessage(id)
  const parkedUntil: number | undefined = facts.state === 'parked' ? facts.expiresAt : undefined
  void sentence, parkedUntil
  const timeline = await protocol.messageTimeline(id)
  for (const entry of timeline.entries) {
    if (entry.kind === 'attempt') console.log(entry.carrier, entry.probe)
  }
  const otlp = await protocol.messageTimeline(id, { format: 'otlp' })
  const traceId: string = otlp.resourceSpans[0].scopeSpans[0].spans[0].traceId
  void traceId
  const controller = new AbortController()
  for await (const ev of protocol.events({ signal: controller.signal })) {
    if (ev.type === 'message_sent') controller.abort()
  }
  try {
    await protocol.sendMessage('', 'x')
  } catch (e) {
    if (e instanceof ProtocolError && e.code === 'ERR_INVALID_ARGUMENT') console.log(e.message)
  }
  console.log(protocol.stats().outboxRegular, relay.stats().connections)
  await protocol.stop()
  await relay.stop()
}

void main()

export function carriers(protocol: Protocol): string[] {
  protocol.registerTransport('ble', { send: async (peerId: string, frame: Uint8Array) => void [peerId, frame.byteLength] })
  protocol.neighborDiscovered('bob', 'ble')
  protocol.receiveFrame('ble', 'bob', new Uint8Array([1]))
  protocol.neighborLost('bob', 'ble')
  protocol.onEvent((ev) => {
    if (ev.type === 'message_undeliverable') {
      const why: UndeliverableReasonCode = ev.reasonCode
      if (why === 'mailbox_full') console.log(ev.recipient, ev.reason, ev.fileId)
    }
    if (ev.type === 'presence_updated') console.log(ev.peerId, ev.online, ev.lastSeenMs)
  })
  return protocol.internetPresenceWatchlist()
}

export const durable = new Protocol({
  appId: 'chat',
  storage: { path: 'bob.db' },
  inboundDurabilityHook: async (batch) => {
    for (const m of batch) {
      const key: string = `${m.chat}/${m.sender}/${m.messageId}`
      if (m.origin === 'redelivery') console.log('again', key)
    }
  },
})

export const sealed = new Protocol({
  appId: 'chat',
  storage: { path: 'carol.db', identitySealKey: new Uint8Array(32) },
  acceptLegacyControlV1: false,
})

export async function overGateway(): Promise<number> {
  const gateway = await Gateway.start({ listen: '127.0.0.1:0' })
  const protocol = new Protocol({
    appId: 'chat',
    storage: { memory: true },
    transports: { gateway: { address: gateway.address } },
  })
  protocol.onEvent((ev) => {
    if (ev.type === 'gateway_status_changed' && ev.attached) console.log('attached', ev.connected)
    if (ev.type === 'security_warning' && ev.reasonCode === 'GATEWAY_ADDRESS_DECLARATION_REFUSED') console.log(ev.peerId)
  })
  await protocol.start()
  const onDefaultPort = new Protocol({ appId: 'chat', storage: { memory: true }, transports: { gateway: {} } })
  void onDefaultPort
  const bound: number = gateway.boundAddresses()
  await protocol.stop()
  await gateway.stop()
  return bound + gateway.port
}

export async function connections(protocol: Protocol, bobAddress: string): Promise<void> {
  const requestId: string = await protocol.sendConnectionRequest(bobAddress, { message: 'hi' })
  protocol.onEvent(async (ev) => {
    if (ev.type === 'connection_request_received') {
      const note: string | null = ev.message
      if (ev.implicit || note !== null) await protocol.acceptConnection(ev.requestId)
      else await protocol.rejectConnection(ev.requestId)
    }
    if (ev.type === 'connection_request_undeliverable') console.log(ev.recipient, ev.replayed === true)
    if (ev.type === 'message_received' && !ev.knownSender) console.log('from a stranger', ev.sender)
  })
  for (const pending of await protocol.connectionRequests()) {
    if (!pending.incoming && pending.requestId !== requestId) await protocol.cancelConnectionRequest(pending.requestId)
  }
  void new Protocol({ appId: 'chat', storage: { memory: true }, encryption: { unknownSenders: 'request' } })
}

export function longLived(url: string, mint: () => Promise<string>): Protocol {
  const protocol = new Protocol({
    appId: 'chat',
    storage: { memory: true },
    transports: { internet: { url, authToken: mint } },
  })
  protocol.onEvent((ev) => {
    if (ev.type === 'auth_failed') {
      const why: AuthFailureReason = ev.reason
      if (why === 'token_expired' || ev.message !== null) console.log(ev.retryInMs)
    }
  })
  protocol.reconnect()
  protocol.setAuthToken('a.b.c')
  void new Protocol({ appId: 'chat', storage: { memory: true }, transports: { internet: { url, authToken: () => 'a.b.c' } } })
  return protocol
}

/** pino's `LogFn` overloads, so a pino logger is checked against `Logger` without depending on pino. */
interface PinoLogFn {
  <T extends object>(obj: T, msg?: string, ...args: unknown[]): void
  (obj: unknown, msg?: string, ...args: unknown[]): void
  (msg: string, ...args: unknown[]): void
}
declare const pino: { level: string; debug: PinoLogFn; info: PinoLogFn; warn: PinoLogFn; error: PinoLogFn; fatal: PinoLogFn }

export async function polish(bobAddress: string): Promise<void> {
  await using relay = await Relay.start({ storage: { memory: true }, jwtSecret: 's3cret-0123456789abcdef-0123456789' })
  await using gateway = await Gateway.start()
  await using protocol = new Protocol({
    appId: 'chat',
    storage: { path: 'dave.db' },
    transports: { internet: { url: relay.url, authToken: issueToken('s3cret-0123456789abcdef-0123456789', 'dave') }, gateway: { address: gateway.address } },
    logger: pino,
  })
  const off = protocol.on('message_delivered', (ev) => {
    const latency: number = ev.latencyMs
    const over: Transport = ev.transport
    // @ts-expect-error: a delivery has no content
    void ev.content
    void [latency, over === 'ble']
  })
  off()
  // @ts-expect-error: not an event type
  protocol.on('message_deliverd', () => {})
  protocol.on('security_warning', (ev) => {
    const code: SecurityWarningReasonCode = ev.reasonCode
    // @ts-expect-error: the reason codes are a closed set
    if (ev.reasonCode === 'NOT_A_CODE') console.log(code)
  })
  protocol.on('message_decryption_failed', (ev) => {
    const code: DecryptionFailureCode = ev.code
    void code
  })
  protocol.on('message_deferred', (ev) => {
    // Open: a carrier's own words are reasons too.
    const reason: MessageDeferredReason = ev.reason
    if (reason === 'no carrier available' || reason.startsWith('cannot seal')) console.log(ev.nextRetryAt)
  })
  protocol.on('diagnostic', (ev) => {
    const level: DiagnosticLevel = ev.level
    void level
  })
  const ready: IdentityReadyEvent = await protocol.once('identity_ready', { signal: AbortSignal.timeout(5000) })
  const next: ProtocolEventOf<'message_failed'> = await protocol.once('message_failed')
  const why: MessageFailedReason = next.reason
  void [ready.address, why]
  await protocol.start()
  const id = await protocol.sendMessage(bobAddress, 'hi')
  try {
    const delivered: MessageDeliveredEvent | null = await protocol.whenDelivered(id, { signal: AbortSignal.timeout(60_000) })
    console.log(delivered?.latencyMs ?? 'delivered before the wait began')
  } catch (e) {
    if (e instanceof ProtocolError && e.code === 'ERR_MESSAGE_FAILED') {
      const failure: MessageFailedEvent | ConnectionRequestUndeliverableEvent | undefined = e.event
      const cause: unknown = e.cause
      void [failure, cause]
    }
  }
  void new ProtocolError('ERR_INTERNAL', 'wrapped', { cause: new Error('native') })
}

export const loggers: Protocol[] = [
  new Protocol({ appId: 'chat', storage: { memory: true }, logger: console, logLevel: 'debug' }),
  new Protocol({ appId: 'chat', storage: { memory: true }, logger: { debug() {}, info() {}, warn() {}, error() {} } }),
  // @ts-expect-error: a logger needs all four methods
  new Protocol({ appId: 'chat', storage: { memory: true }, logger: { debug() {}, info() {}, warn() {} } }),
]

export const storages = [
  // @ts-expect-error: exactly one of path and memory
  new Protocol({ appId: 'chat', storage: { path: 'x.db', memory: true } }),
  // @ts-expect-error: exactly one of path and memory
  new Protocol({ appId: 'chat', storage: {} }),
  // @ts-expect-error: exactly one of path and memory
  Relay.start({ storage: { path: 'relay.db', memory: true }, jwtSecret: 's3cret-0123456789abcdef-0123456789' }),
]

/** A group chat as an app writes one: every group call and event typed. */
export async function groupChat(protocol: Protocol, friends: string[]): Promise<GroupInfo[]> {
  const groupId: string = await protocol.createGroup('friends', friends)
  protocol.on('group_created', (ev) => console.log(ev.groupId, ev.name, ev.admin, ev.members.length))
  protocol.on('group_member_added', (ev) => console.log(ev.member, ev.addedBy))
  protocol.on('group_member_removed', (ev) => console.log(ev.member, ev.removedBy))
  protocol.on('group_relay_sync_changed', (ev) => console.log(ev.groupId, ev.synced))
  protocol.on('group_message_sent', (ev) => {
    const path: 'relay' | 'fanout' = ev.path
    console.log(path, ev.members)
  })
  protocol.on('group_message_delivery_report', (ev) => console.log(ev.delivered, ev.pushed, ev.missedReissued))
  protocol.on('group_message_member_status', (ev) => {
    const status: GroupMemberStatus = ev.status
    console.log(ev.member, status)
  })
  protocol.on('message_received', (ev) => {
    if (ev.groupId !== undefined) console.log(`in ${ev.groupId}: ${String(ev.content)}`)
  })
  const id: string = await protocol.sendGroupMessage(groupId, 'hello', { priority: 'high', metadata: { k: 'v' } })
  const status: GroupMessageStatus | null = await protocol.getGroupMessageStatus(id)
  if (status) for (const [member, state] of Object.entries(status.members)) console.log(member, state)
  await protocol.addGroupMember(groupId, friends[0])
  await protocol.removeGroupMember(groupId, friends[0])
  await protocol.leaveGroup(groupId).catch((e: unknown) => {
    if (e instanceof ProtocolError && e.code === 'ERR_GROUP_NOT_FOUND') return
    throw e
  })
  void new Protocol({ appId: 'chat', storage: { memory: true }, group: { relayBroadcastEnabled: false } })
  return protocol.listGroups()
}

export async function richMessages(protocol: Protocol, bobAddress: string, groupId: string): Promise<string> {
  protocol.on('message_received', (ev) => {
    const replyTo: string | null = ev.replyTo
    const quote: Quote | null = ev.quote
    const mentions: string[] = ev.mentions
    const extras: Record<string, unknown> | null = ev.extras
    const origin: ForwardInfo | null = ev.forwardInfo
    if (origin !== null) console.log(origin.messageId, origin.sender, origin.timestamp, origin.chat ?? '-', origin.forwardCount)
    console.log(replyTo, quote?.text, quote?.sender, quote?.messageId, mentions.length, extras?.['thread'])
  })
  const options: SendOptions = {
    replyTo: 'm-1',
    quote: { text: 'dinner at 8?', sender: bobAddress, messageId: 'm-1' },
    mentions: [bobAddress],
    extras: { thread: 7, tags: ['plans'] },
  }
  await protocol.sendMessage(bobAddress, 'yes', options)
  await protocol.sendGroupMessage(groupId, 'yes', { mentions: [bobAddress], extras: { pinned: true } })
  const forwardOptions: ForwardOptions = { priority: 'low', id: 'fwd-1' }
  await protocol.forwardMessage('m-1', groupId, forwardOptions)
  const hooked = new Protocol({
    appId: 'chat',
    storage: { path: 'hooked.db' },
    inboundDurabilityHook: async (batch: InboundMessage[]) => {
      for (const m of batch) console.log(m.replyTo, m.quote?.text, m.mentions, m.extras, m.forwardInfo?.forwardCount)
    },
  })
  void hooked
  try {
    return await protocol.forwardMessage('m-2', bobAddress)
  } catch (e) {
    if (e instanceof ProtocolError && e.code === 'ERR_MESSAGE_NOT_FOUND') return 'not kept'
    throw e
  }
}
