// Type-checked in a project that installed the packed tarballs: ESM consumers.
import courier, { Protocol, ProtocolError, issueToken, type ProtocolEvent } from 'offline-courier'

const protocol = new Protocol({
  appId: 'chat',
  storage: { path: 'chat.db' },
  transports: { internet: { url: 'ws://127.0.0.1:1', authToken: async () => issueToken('types-secret-0123456789abcdef-0123', 'alice') } },
})
protocol.onEvent((ev: ProtocolEvent) => {
  if (ev.type === 'message_delivered') console.log(ev.latencyMs)
})
export const code: ProtocolError['code'] = 'ERR_CONFIG'
export const same: typeof Protocol = courier.Protocol
