'use strict'
// DEVELOPMENT ONLY. Stands in for the app's backend so the example runs against a local relay:
// it mints a relay token for whatever account the caller names, with no sign-in at all. A real
// backend authenticates the user first and names the account itself.
//
//   node dev-token-server.js secret.txt [port]   # then COURIER_TOKEN_URL=http://127.0.0.1:8787/token?account=alice

const { readFileSync } = require('node:fs')
const http = require('node:http')
const { issueToken } = require('offline-courier')

const [secretFile, port = '8787'] = process.argv.slice(2)
if (!secretFile) {
  console.error('usage: node dev-token-server.js SECRET_FILE [PORT]')
  process.exit(2)
}
// As the relay reads --jwt-secret-file: a trailing newline is not part of the secret.
const secret = readFileSync(secretFile, 'utf8').replace(/[\r\n]+$/, '')

http
  .createServer((request, response) => {
    const url = new URL(request.url, 'http://localhost')
    const account = url.searchParams.get('account')
    if (request.method !== 'POST' || url.pathname !== '/token' || !account) {
      response.writeHead(400).end('POST /token?account=NAME\n')
      return
    }
    // Short-lived on purpose: the app asks again at every connect.
    response.writeHead(200, { 'content-type': 'application/json' })
    response.end(JSON.stringify({ token: issueToken(secret, account, { expiresInSec: 600 }) }))
  })
  .listen(Number(port), '127.0.0.1', () => console.log(`dev token server on http://127.0.0.1:${port}/token?account=NAME`))
