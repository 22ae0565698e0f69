// Type-checked in a project that installed the packed tarballs: CommonJS consumers.
import courier = require('offline-courier')
import type { ProtocolEvent } from 'offline-courier'

const protocol = new courier.Protocol({ appId: 'chat', storage: { memory: true } })
protocol.onEvent((ev: ProtocolEvent) => {
  if (ev.type === 'auth_failed') console.log(ev.reason, ev.retryInMs)
})
export = protocol
