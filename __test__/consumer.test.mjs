// The package as a user gets it: the root and this platform's package packed as a release
// stages them (`scripts/stage-packages.mjs`), installed into an empty project outside the
// repository with no Rust toolchain on PATH and no network, then used by `require`, by
// `import`, against a relay started with `npx courier-relay`, and type-checked through the
// `exports` map. Without its platform package the loader names the package to install.
import assert from 'node:assert/strict'
import { spawn, spawnSync } from 'node:child_process'
import { accessSync, constants, cpSync, mkdirSync, readdirSync, rmSync, writeFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { delimiter, join } from 'node:path'
import { createInterface } from 'node:readline'
import { test } from 'node:test'
import { fileURLToPath } from 'node:url'

import { stagePackages } from '../scripts/stage-packages.mjs'
import { tempDir } from './helpers.mjs'

const FIXTURES = fileURLToPath(new URL('./consumer/', import.meta.url))
const REPO_TYPES = fileURLToPath(new URL('../node_modules/@types', import.meta.url))
const TSC = createRequire(import.meta.url).resolve('typescript/bin/tsc')

/** `PATH` without any directory that holds a Rust toolchain. */
function withoutRust(env) {
  const holdsRust = (dir) =>
    ['cargo', 'rustc'].some((tool) => {
      try {
        accessSync(join(dir, tool), constants.X_OK)
        return true
      } catch {
        return false
      }
    })
  const PATH = env.PATH.split(delimiter).filter((dir) => dir && !holdsRust(dir)).join(delimiter)
  return { ...env, PATH, npm_config_offline: 'true', npm_config_audit: 'false', npm_config_fund: 'false' }
}

function run(cmd, args, options) {
  const result = spawnSync(cmd, args, { encoding: 'utf8', timeout: 120_000, ...options })
  assert.equal(result.status, 0, `${cmd} ${args.join(' ')} failed:\n${result.stdout}\n${result.stderr}`)
  return result.stdout
}

/** `npx courier-relay` from the installed package; resolves with its URL once it listens. */
async function startRelay(t, project, env, secretFile) {
  // npx runs the bin as a child of its own: the relay is stopped as a process group, so that
  // no orphan keeps this test's pipes open.
  const relay = spawn('npx', ['--no', '--', 'courier-relay', '--listen', '127.0.0.1:0', '--memory', '--jwt-secret-file', secretFile], {
    cwd: project,
    env,
    detached: true,
    stdio: ['ignore', 'pipe', 'pipe'],
  })
  const stop = (signal) => {
    try {
      process.kill(-relay.pid, signal)
    } catch {
      // Already gone.
    }
  }
  t.after(() => stop('SIGKILL'))
  let stderr = ''
  relay.stderr.setEncoding('utf8').on('data', (chunk) => (stderr += chunk))
  const lines = createInterface({ input: relay.stdout })
  const timer = setTimeout(() => stop('SIGKILL'), 30_000)
  try {
    for await (const line of lines) {
      const match = /^courier-relay listening on (ws:\/\/\S+)$/.exec(line)
      if (match) return match[1]
    }
  } finally {
    clearTimeout(timer)
  }
  throw new Error(`npx courier-relay exited before it listened:\n${stderr}`)
}

test('the packed packages install and work with no Rust toolchain, no network and no repository', async (t) => {
  const work = tempDir(t)
  const dist = join(work, 'dist')
  mkdirSync(dist)
  const [root, platform] = stagePackages({ out: dist, hostOnly: true })
  assert.match(root, /offline-courier-\d+\.\d+\.\d+\.tgz$/)
  const platformPackage = /(offline-courier-[a-z0-9-]+)-\d+\.\d+\.\d+\.tgz$/.exec(platform)[1]

  const project = join(work, 'consumer')
  mkdirSync(project)
  writeFileSync(join(project, 'package.json'), JSON.stringify({ name: 'consumer', private: true }))
  const env = withoutRust(process.env)
  assert.equal(spawnSync('cargo', ['--version'], { env }).error?.code, 'ENOENT', 'cargo is off PATH')
  run('npm', ['install', root, platform], { cwd: project, env })
  const installed = readdirSync(join(project, 'node_modules')).filter((name) => !name.startsWith('.'))
  assert.deepEqual(installed.sort(), ['offline-courier', platformPackage].sort())
  for (const file of readdirSync(FIXTURES)) cpSync(join(FIXTURES, file), join(project, file))

  // A send→deliver round trip, sealed, against the relay the package ships.
  const secretFile = join(project, 'secret')
  writeFileSync(secretFile, 'consumer-secret-0123456789abcdef-01')
  const url = await startRelay(t, project, env, secretFile)
  const delivered = JSON.parse(run(process.execPath, ['round-trip.cjs', url, secretFile], { cwd: project, env }))
  assert.deepEqual(delivered, { content: 'hello from a registry install', encrypted: true })

  const esm = JSON.parse(run(process.execPath, ['esm.mjs'], { cwd: project, env }))
  assert.deepEqual(esm, { same: true, sameDefault: true, relayUrl: true, code: 'ERR_CONFIG' })

  // Types through the package's `exports` map, as ESM and as CommonJS.
  const compilerOptions = {
    strict: true,
    noEmit: true,
    module: 'nodenext',
    moduleResolution: 'nodenext',
    target: 'es2022',
    types: ['node'],
    typeRoots: [REPO_TYPES],
  }
  writeFileSync(join(project, 'tsconfig.json'), JSON.stringify({ compilerOptions, files: ['types.mts', 'types.cts'] }))
  run(process.execPath, [TSC, '-p', project], { cwd: project, env })

  // Installed without its platform package, the package says which one it needs.
  rmSync(join(project, 'node_modules', platformPackage), { recursive: true })
  const missing = spawnSync(process.execPath, ['-e', "try { require('offline-courier') } catch (e) { console.log(JSON.stringify({ code: e.code, message: e.message })) }"], {
    cwd: project,
    env,
    encoding: 'utf8',
  })
  const error = JSON.parse(missing.stdout)
  assert.equal(error.code, 'ERR_NATIVE_BINDING')
  assert.ok(error.message.includes(`the package ${platformPackage}`), error.message)
  assert.ok(error.message.includes(`npm install ${platformPackage}@`), error.message)
  assert.ok(!error.message.includes('4828'), 'no pointer to an npm bug')
})
