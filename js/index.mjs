import courier from './index.js'

export const { Protocol, ProtocolError, Relay, issueToken } = courier
export default courier
