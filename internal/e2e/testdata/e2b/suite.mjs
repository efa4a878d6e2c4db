// E2B's JS SDK against nook serve --e2b-listen, used as an E2B user would.
// Run by TestE2BSDK (internal/e2e/e2b_test.go) with E2B_API_URL,
// E2B_SANDBOX_URL and E2B_API_KEY set, and E2B_SDK_DIR the directory make
// deps installed the SDK into. Prints `ok - NAME` or `not ok - NAME: error`
// per case and exits 1 if any failed.
import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { pathToFileURL } from 'node:url'

const sdkDir = process.env.E2B_SDK_DIR
if (!sdkDir) {
  console.error('E2B_SDK_DIR is not set: it names the directory holding node_modules/e2b')
  process.exit(2)
}
// The package has no exports map: its ESM build is dist/index.mjs.
const {
  Sandbox,
  AuthenticationError,
  CommandExitError,
  FileNotFoundError,
  FileType,
  FilesystemEventType,
  SandboxNotFoundError,
} = await import(pathToFileURL(`${sdkDir}/node_modules/e2b/dist/index.mjs`).href)

// E2B's default template, which nook serves from its e2b recipe: E2B's
// default user, user, and root.
const template = 'base'
const sandboxUrl = process.env.E2B_SANDBOX_URL
const caseTimeoutMs = 90_000
const enc = new TextEncoder()

// within settles as p does, or rejects once ms pass, saying what (a
// string, or a function giving one then) did not happen.
function within(p, ms, what) {
  let timer
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${typeof what === 'function' ? what() : what}: nothing after ${ms} ms`)), ms)
  })
  return Promise.race([p, timeout]).finally(() => clearTimeout(timer))
}

// condition(pred) is a promise that resolves the first time pred() holds
// when poke() is called (from the callback that changes what pred reads).
function condition(pred) {
  let resolve
  const p = new Promise((r) => (resolve = r))
  return {
    poke: () => pred() && resolve(),
    wait: (ms, what) => within(p, ms, what),
  }
}

// until polls the async pred, every 50 ms, until it holds, or rejects
// once ms pass, saying what did not happen.
async function until(pred, ms, what) {
  const end = Date.now() + ms
  for (;;) {
    if (await pred()) return
    if (Date.now() > end) throw new Error(`${what}: not so after ${ms} ms`)
    await new Promise((r) => setTimeout(r, 50))
  }
}

// describe is an error's name and message, with those of its causes
// (fetch's "fetch failed" says why only in its cause).
function describe(err) {
  if (!(err instanceof Error)) return String(err)
  const s = `${err.name}: ${err.message}`
  return err.cause ? `${s} (cause: ${describe(err.cause)})` : s
}

// rejects awaits p and returns its error, which must be an instance of cls.
async function rejects(p, cls, what) {
  let result
  try {
    result = await p
  } catch (err) {
    if (err instanceof cls) return err
    throw new Error(`${what}: threw ${describe(err)}, want ${cls.name}`)
  }
  throw new Error(`${what}: returned ${JSON.stringify(result)}, want ${cls.name}`)
}

const results = []

// check runs one case, bounded, and prints its outcome: `ok - NAME`, or
// `not ok - NAME: ERROR` with the rest of the error (an assertion's diff,
// the suite's frames of the stack) on `#` lines after it.
async function check(name, fn) {
  try {
    await within(fn(), caseTimeoutMs, name)
    results.push(true)
    console.log(`ok - ${name}`)
  } catch (err) {
    results.push(false)
    const [first, ...rest] = describe(err).split('\n')
    console.log(`not ok - ${name}: ${first}`)
    const frames = String(err?.stack ?? '').split('\n').filter((l) => l.includes('suite.mjs'))
    for (const line of [...rest, ...frames]) if (line.trim()) console.log(`#   ${line.trim()}`)
  }
}

// withSandbox runs fn with a new sandbox, killed afterwards whatever fn did.
async function withSandbox(opts, fn) {
  const sbx = await Sandbox.create(template, opts)
  let done = false
  try {
    await fn(sbx)
    done = true
  } finally {
    try {
      await sbx.kill()
    } catch (err) {
      if (done) throw new Error(`kill of ${sbx.sandboxId}: ${err.message}`)
    }
  }
}

async function listAll(opts) {
  const pager = Sandbox.list(opts)
  const all = []
  while (pager.hasNext) all.push(...(await pager.nextItems()))
  return all
}

// envd sends a raw request to a sandbox's envd, as the SDK addresses it.
function envd(path, { sandboxId, token, headers = {}, body, method = 'POST' }) {
  const h = { 'E2b-Sandbox-Id': sandboxId, 'E2b-Sandbox-Port': '49983', ...headers }
  if (token !== undefined) h['X-Access-Token'] = token
  return fetch(`${sandboxUrl}${path}`, { method, headers: h, body })
}

const unary = { 'Content-Type': 'application/json', 'Connect-Protocol-Version': '1' }
const streaming = { 'Content-Type': 'application/connect+json', 'Connect-Protocol-Version': '1' }

// envelope is one Connect frame: flags, big-endian length, payload.
function envelope(flags, payload, length = payload.length) {
  const b = Buffer.alloc(5 + payload.length)
  b[0] = flags
  b.writeUInt32BE(length, 1)
  Buffer.from(payload).copy(b, 5)
  return b
}

// frames splits a Connect streaming body into its envelopes.
function frames(buf) {
  const out = []
  for (let i = 0; i + 5 <= buf.length; ) {
    const len = buf.readUInt32BE(i + 1)
    out.push({ flags: buf[i], data: buf.subarray(i + 5, i + 5 + len).toString() })
    i += 5 + len
  }
  return out
}

// --- commands ---

// E2B_SUITE=net: the egress policy, in a simulated host and world
// (allowed.test and denied.test are the world's web servers).
if (process.env.E2B_SUITE === 'net') {
  await check('network: allowOut at create, updateNetwork after', () =>
    withSandbox({ network: { allowOut: ['allowed.test'] } }, async (sbx) => {
      const curl = async (url) => {
        try {
          return (await sbx.commands.run(`curl -sS --max-time 10 ${url}`)).stdout
        } catch (err) {
          return `curl failed: exit ${err.exitCode}`
        }
      }
      assert.equal(await curl('http://allowed.test/'), 'allowed-web')
      assert.match(await curl('http://denied.test/'), /^curl failed/)
      await sbx.updateNetwork({ allowOut: ['denied.test'], allowInternetAccess: false })
      assert.equal(await curl('http://denied.test/'), 'denied-web')
      assert.match(await curl('http://allowed.test/'), /^curl failed/)
    }))
} else if (process.env.E2B_SUITE === 'vm') {
  await check('vm: commands, files and a port in a vm sandbox', async () => {
    const sbx = await Sandbox.create(template, { metadata: { 'nook.isolation': 'vm' }, timeoutMs: 600_000, requestTimeoutMs: 300_000 })
    try {
      const r = await sbx.commands.run('id -un; echo hi', { timeoutMs: 120_000 })
      assert.equal(r.stdout, 'user\nhi\n')
      await sbx.files.write('v.txt', 'vm file')
      assert.equal(await sbx.files.read('/home/user/v.txt'), 'vm file')
      await sbx.commands.run('cd /tmp && echo vmserved > i.html && python3 -m http.server 8000', { background: true })
      const get = () => fetch(`${sandboxUrl}/i.html`, { headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '8000' } })
      await until(async () => (await get()).status === 200, 60_000, 'the server in the vm answers through the edge')
      assert.equal((await (await get()).text()).trim(), 'vmserved')
    } finally {
      await sbx.kill()
    }
  })
} else {
await check('commands.run: stdout and exit code 0', () =>
  withSandbox({}, async (sbx) => {
    const r = await sbx.commands.run('echo hi')
    assert.equal(r.stdout, 'hi\n')
    assert.equal(r.stderr, '')
    assert.equal(r.exitCode, 0)
  }))

await check('commands.run: a non-zero exit throws CommandExitError with the output', () =>
  withSandbox({}, async (sbx) => {
    const err = await rejects(sbx.commands.run('echo out; echo err >&2; exit 3'), CommandExitError, 'exit 3')
    assert.equal(err.exitCode, 3)
    assert.equal(err.stdout, 'out\n')
    assert.equal(err.stderr, 'err\n')
  }))

await check('commands.run: stderr, envs, cwd and user', () =>
  withSandbox({}, async (sbx) => {
    const r = await sbx.commands.run('echo oops >&2; echo "$GREETING $(pwd)"', { envs: { GREETING: 'hello' }, cwd: '/tmp' })
    assert.equal(r.stderr, 'oops\n')
    assert.equal(r.stdout, 'hello /tmp\n')
    // As in E2B: commands run as user, in its home, unless told otherwise.
    assert.equal((await sbx.commands.run('id -un; pwd')).stdout, 'user\n/home/user\n')
    assert.equal((await sbx.commands.run('id -un; pwd', { user: 'root' })).stdout, 'root\n/root\n')
  }))

await check('commands.run: onStdout streams output as it is printed', () =>
  withSandbox({}, async (sbx) => {
    const chunks = []
    const r = await sbx.commands.run('for i in 1 2 3; do echo $i; sleep 0.2; done', {
      onStdout: (data) => chunks.push({ data, at: Date.now() }),
    })
    const end = Date.now()
    assert.equal(r.stdout, '1\n2\n3\n')
    assert.equal(chunks.map((c) => c.data).join(''), '1\n2\n3\n')
    assert.ok(chunks.length >= 2, `stdout came in ${chunks.length} chunk(s), not as printed`)
    assert.ok(end - chunks[0].at >= 200, `the first line arrived ${end - chunks[0].at} ms before the end, not as printed (~600 ms)`)
  }))

await check('commands: background, list, connect, kill', () =>
  withSandbox({}, async (sbx) => {
    const cmd = 'while :; do echo tick; sleep 0.2; done'
    const h = await sbx.commands.run(cmd, { background: true })
    assert.ok(Number.isInteger(h.pid) && h.pid > 0, `pid ${h.pid}`)
    const listed = (await sbx.commands.list()).find((p) => p.pid === h.pid)
    assert.ok(listed, `commands.list() does not show pid ${h.pid}`)
    assert.equal(listed.cmd, '/bin/bash')
    assert.deepEqual(listed.args, ['-l', '-c', cmd])
    // A second client attaches and gets the output from then on.
    let attached = ''
    const ticked = condition(() => attached.includes('tick\n'))
    const c = await sbx.commands.connect(h.pid, {
      onStdout: (data) => {
        attached += data
        ticked.poke()
      },
    })
    assert.equal(c.pid, h.pid)
    await ticked.wait(15_000, 'output through commands.connect')
    assert.equal(await h.kill(), true, 'kill of a running command')
    // Both streams end with the kill (SIGKILL: a non-zero exit).
    await within(rejects(h.wait(), CommandExitError, 'wait on the started handle'), 15_000, 'wait on the started handle')
    await within(rejects(c.wait(), CommandExitError, 'wait on the connected handle'), 15_000, 'wait on the connected handle')
    assert.ok(!(await sbx.commands.list()).some((p) => p.pid === h.pid), 'a killed command is still listed')
    assert.equal(await sbx.commands.kill(h.pid), false, 'kill of an ended command')
    assert.equal(await sbx.commands.kill(999_999), false, 'kill of an unknown pid')
  }))

await check('commands: stdin', () =>
  withSandbox({}, async (sbx) => {
    const h = await sbx.commands.run('cat', { background: true, stdin: true })
    await sbx.commands.sendStdin(h.pid, 'abc\n')
    await sbx.commands.closeStdin(h.pid)
    const r = await within(h.wait(), 15_000, 'cat after its stdin closed')
    assert.equal(r.stdout, 'abc\n')
    assert.equal(r.exitCode, 0)
  }))

await check('pty: create, input, resize, kill', () =>
  withSandbox({}, async (sbx) => {
    const dec = new TextDecoder()
    let out = ''
    const conds = []
    const seen = (s) => {
      const c = condition(() => out.includes(s))
      conds.push(c)
      c.poke()
      return c
    }
    const h = await sbx.pty.create({
      cols: 80,
      rows: 24,
      onData: (d) => {
        out += dec.decode(d, { stream: true })
        for (const c of conds) c.poke()
      },
    })
    // The terminal echoes input: look for what only the command prints.
    await sbx.pty.sendInput(h.pid, enc.encode('echo pty$((40+2))ok\n'))
    await seen('pty42ok').wait(15_000, () => `pty42ok in the pty's output (so far ${JSON.stringify(out)})`)
    await sbx.pty.resize(h.pid, { cols: 100, rows: 30 })
    await sbx.pty.sendInput(h.pid, enc.encode('stty size\n'))
    await seen('30 100').wait(15_000, () => `30 100 from stty size after the resize (so far ${JSON.stringify(out)})`)
    assert.equal(await sbx.pty.kill(h.pid), true, 'kill of the pty')
    await within(h.wait().catch(() => {}), 15_000, 'the pty after its kill')
    assert.equal(await sbx.pty.kill(h.pid), false, 'kill of an ended pty')
  }))

// --- files ---

await check('files: write, read, list, exists, getInfo', () =>
  withSandbox({}, async (sbx) => {
    const info = await sbx.files.write('/tmp/a.txt', 'hello')
    assert.equal(info.path, '/tmp/a.txt')
    assert.equal(info.name, 'a.txt')
    assert.equal(await sbx.files.read('/tmp/a.txt'), 'hello')
    assert.equal((await sbx.commands.run('cat /tmp/a.txt')).stdout, 'hello')
    const entry = (await sbx.files.list('/tmp')).find((e) => e.name === 'a.txt')
    assert.ok(entry, 'files.list(/tmp) lacks a.txt')
    assert.equal(entry.type, FileType.FILE)
    assert.equal(entry.path, '/tmp/a.txt')
    assert.equal(entry.size, 5)
    assert.deepEqual([entry.owner, entry.group], ['user', 'user'], 'owner and group (names, as envd gives them) of a file the default user wrote')
    assert.equal(await sbx.files.exists('/tmp/a.txt'), true)
    assert.equal(await sbx.files.exists('/tmp/nothing-here'), false)
    const st = await sbx.files.getInfo('/tmp')
    assert.equal(st.type, FileType.DIR)
    // Overwrite, and a write into directories that do not exist yet.
    await sbx.files.write('/tmp/a.txt', 'bye')
    assert.equal(await sbx.files.read('/tmp/a.txt'), 'bye')
    await sbx.files.write('/tmp/new/dirs/c.txt', 'deep')
    assert.equal((await sbx.commands.run('cat /tmp/new/dirs/c.txt')).stdout, 'deep')
  }))

await check('files: paths and owners follow the user', () =>
  withSandbox({}, async (sbx) => {
    // A relative path is in the user's home.
    const rel = await sbx.files.write('notes/rel.txt', 'relative')
    assert.equal(rel.path, '/home/user/notes/rel.txt')
    assert.equal((await sbx.commands.run('stat -c %U:%G notes notes/rel.txt; cat notes/rel.txt')).stdout, 'user:user\nuser:user\nrelative')
    // Another user's relative path is in its home, and its file is its own.
    const rooted = await sbx.files.write('yes.txt', 'x', { user: 'root' })
    assert.equal(rooted.path, '/root/yes.txt')
    const st = await sbx.files.getInfo('/root/yes.txt')
    assert.deepEqual([st.owner, st.group], ['root', 'root'], 'owner and group of a file root wrote')
  }))

await check('files: makeDir, rename, remove', () =>
  withSandbox({}, async (sbx) => {
    assert.equal(await sbx.files.makeDir('/tmp/d'), true, 'first makeDir')
    assert.equal(await sbx.files.makeDir('/tmp/d'), false, 'second makeDir')
    await sbx.files.write('/tmp/a.txt', 'hello')
    const moved = await sbx.files.rename('/tmp/a.txt', '/tmp/d/b.txt')
    assert.equal(moved.path, '/tmp/d/b.txt')
    assert.equal(moved.name, 'b.txt')
    assert.equal(await sbx.files.exists('/tmp/a.txt'), false)
    assert.equal(await sbx.files.read('/tmp/d/b.txt'), 'hello')
    await sbx.files.remove('/tmp/d/b.txt')
    assert.equal(await sbx.files.exists('/tmp/d/b.txt'), false)
    await sbx.files.remove('/tmp/d')
    assert.equal(await sbx.files.exists('/tmp/d'), false)
  }))

await check('files: a missing file throws FileNotFoundError', () =>
  withSandbox({}, async (sbx) => {
    await rejects(sbx.files.read('/tmp/missing.txt'), FileNotFoundError, 'read of a missing file')
  }))

await check('files: several files in one write', () =>
  withSandbox({}, async (sbx) => {
    const infos = await sbx.files.write([
      { path: '/tmp/m/one.txt', data: 'one' },
      { path: '/tmp/m/sub/two.txt', data: 'two' },
    ])
    assert.deepEqual(infos.map((i) => i.path).sort(), ['/tmp/m/one.txt', '/tmp/m/sub/two.txt'])
    assert.equal(await sbx.files.read('/tmp/m/one.txt'), 'one')
    assert.equal(await sbx.files.read('/tmp/m/sub/two.txt'), 'two')
  }))

await check('files: binary round trip', () =>
  withSandbox({}, async (sbx) => {
    const bytes = Uint8Array.from({ length: 256 }, (_, i) => i)
    await sbx.files.write('/tmp/bin', bytes.buffer)
    assert.equal((await sbx.commands.run('wc -c < /tmp/bin; od -An -tx1 -j255 /tmp/bin')).stdout, '256\n ff\n')
    const back = await sbx.files.read('/tmp/bin', { format: 'bytes' })
    assert.deepEqual(Buffer.from(back), Buffer.from(bytes))
  }))

await check('files: watchDir sees a file created', () =>
  withSandbox({}, async (sbx) => {
    await sbx.files.makeDir('/tmp/w')
    const events = []
    const created = condition(() => events.some((e) => e.name === 'new.txt' && e.type === FilesystemEventType.CREATE))
    const handle = await sbx.files.watchDir('/tmp/w', (e) => {
      events.push(e)
      created.poke()
    })
    try {
      await sbx.files.write('/tmp/w/new.txt', 'x')
      await created.wait(15_000, () => `a create event for new.txt (got ${JSON.stringify(events)})`)
    } finally {
      await handle.stop()
    }
  }))

// --- lifecycle ---

await check('lifecycle: list by metadata, timeout, info, pause, resume, kill', async () => {
  const suite = randomBytes(6).toString('hex')
  const a = await Sandbox.create(template, { metadata: { suite, role: 'a' } })
  const other = await Sandbox.create(template, { metadata: { suite: `${suite}-other` } })
  try {
    const listed = await listAll({ query: { metadata: { suite } } })
    assert.deepEqual(listed.map((s) => s.sandboxId), [a.sandboxId], 'Sandbox.list by metadata')
    assert.equal(listed[0].state, 'running')
    assert.deepEqual(listed[0].metadata, { suite, role: 'a' })
    assert.ok(listed[0].endAt > listed[0].startedAt, `endAt ${listed[0].endAt} startedAt ${listed[0].startedAt}`)

    await a.setTimeout(120_000)
    const info = await a.getInfo()
    assert.equal(info.sandboxId, a.sandboxId)
    assert.deepEqual(info.metadata, { suite, role: 'a' })
    const left = info.endAt.getTime() - Date.now()
    assert.ok(left > 100_000 && left <= 125_000, `after setTimeout(120 s) the sandbox ends in ${left} ms`)
    assert.equal(await a.isRunning(), true)

    await a.files.write('/home/user/kept.txt', 'from before the pause')
    const bg = await a.commands.run('sleep 600', { background: true, timeoutMs: 0 })
    await bg.disconnect()
    assert.equal(await a.pause(), true, 'pause')
    assert.equal(await a.isRunning(), false, 'isRunning after the pause')
    assert.equal(await a.pause(), false, 'pause of a paused sandbox')
    assert.equal((await Sandbox.getInfo(a.sandboxId)).state, 'paused')
    const paused = await listAll({ query: { metadata: { suite }, state: ['paused'] } })
    assert.deepEqual(paused.map((s) => s.sandboxId), [a.sandboxId], 'Sandbox.list of paused sandboxes')

    const b = await Sandbox.connect(a.sandboxId)
    assert.equal(b.sandboxId, a.sandboxId)
    assert.equal(await b.isRunning(), true, 'isRunning after connect')
    assert.equal(await b.files.read('/home/user/kept.txt'), 'from before the pause')
    assert.ok((await b.commands.list()).some((p) => p.pid === bg.pid), `the background command (pid ${bg.pid}) is gone after the resume`)

    assert.equal(await b.kill(), true, 'kill')
    assert.equal(await b.isRunning(), false, 'isRunning after the kill')
    assert.equal(await Sandbox.kill(a.sandboxId), false, 'a second kill')
    await rejects(Sandbox.getInfo(a.sandboxId), SandboxNotFoundError, 'getInfo of a killed sandbox')
  } finally {
    await Promise.allSettled([a.kill(), other.kill()])
  }
})

await check('lifecycle: connect to an unknown sandbox throws', async () => {
  await rejects(Sandbox.connect('e2b-doesnotexist'), SandboxNotFoundError, 'Sandbox.connect of an unknown id')
})

// --- refusals ---

await check('auth: a wrong API key is refused', async () => {
  const apiKey = `e2b_${'0'.repeat(40)}`
  await rejects(Sandbox.create(template, { apiKey }), AuthenticationError, 'Sandbox.create')
  await rejects(Sandbox.list({ apiKey }).nextItems(), AuthenticationError, 'Sandbox.list')
})

await check('auth: envd wants the sandbox its own access token', () =>
  withSandbox({}, async (a) =>
    withSandbox({}, async (b) => {
      const list = (sandboxId, token) => envd('/process.Process/List', { sandboxId, token, headers: unary, body: '{}' })
      const res = await list(a.sandboxId, a.envdAccessToken)
      const body = await res.text()
      assert.equal(res.status, 200, `List with the sandbox's token: ${res.status} ${body}`)
      assert.ok(Array.isArray(JSON.parse(body).processes ?? []), `List with the sandbox's token: ${body}`)
      for (const [what, sandboxId, token] of [
        ['a wrong token', a.sandboxId, 'wrong'],
        ['no token', a.sandboxId, undefined],
        [`another sandbox's token`, b.sandboxId, a.envdAccessToken],
      ]) {
        const r = await list(sandboxId, token)
        assert.equal(r.status, 401, `List with ${what}: ${r.status} ${await r.text()}`)
      }
      const files = await envd('/files?path=/etc/hostname', { sandboxId: a.sandboxId, token: 'wrong', method: 'GET' })
      assert.equal(files.status, 401, `GET /files with a wrong token: ${files.status} ${await files.text()}`)
    })))

await check('envd: an unknown sandbox gets 502', async () => {
  for (const [path, method, headers, body] of [
    ['/process.Process/List', 'POST', unary, '{}'],
    ['/health', 'GET', {}, undefined],
  ]) {
    const r = await envd(path, { sandboxId: 'e2b-doesnotexist', method, headers, body })
    assert.equal(r.status, 502, `${method} ${path}: ${r.status} ${await r.text()}`)
  }
})

await check('envd: malformed Connect requests get an error answer', () =>
  withSandbox({}, async (sbx) => {
    const garbage = enc.encode('garbage!')
    const cases = [
      ['garbage after a 5-byte length', envelope(0, garbage, 5)],
      ['a length past the body', envelope(0, garbage, 100)],
      ['a length of 4 GiB', envelope(0, garbage, 0xffffffff)],
      ['a compressed frame', envelope(1, enc.encode('{}'))],
      ['JSON that is not a StartRequest', envelope(0, enc.encode('{"process": 7}'))],
      ['a truncated header', Buffer.from([0, 0, 0])],
    ]
    for (const [what, body] of cases) {
      const r = await envd('/process.Process/Start', { sandboxId: sbx.sandboxId, token: sbx.envdAccessToken, headers: streaming, body })
      const buf = Buffer.from(await r.arrayBuffer())
      if (r.status === 200) {
        // Connect streams report errors in their end-of-stream frame.
        const fs = frames(buf)
        const end = fs.at(-1)
        assert.ok(end && end.flags & 2 && JSON.parse(end.data).error?.code, `Start with ${what}: 200 without an error end frame: ${JSON.stringify(fs)}`)
        assert.ok(!fs.some((f) => !(f.flags & 2) && f.data.includes('"start"')), `Start with ${what} started a process`)
      } else {
        assert.ok(r.status >= 400 && r.status < 500, `Start with ${what}: ${r.status} ${buf}`)
      }
    }
    const bad = await envd('/process.Process/List', { sandboxId: sbx.sandboxId, token: sbx.envdAccessToken, headers: unary, body: '{not json' })
    assert.ok(bad.status >= 400 && bad.status < 500, `List with a body that is not JSON: ${bad.status} ${await bad.text()}`)
    // The daemon kept serving.
    assert.equal((await sbx.commands.run('echo still here')).stdout, 'still here\n')
  }))

await check('snapshots, forks and metrics: a snapshot is a template to create from, a fork copies a running sandbox', () =>
  withSandbox({}, async (sbx) => {
    await sbx.files.write('state.txt', 'before')
    const snap = await sbx.createSnapshot()
    assert.ok(snap.snapshotId.startsWith(`${sbx.sandboxId}:`), `snapshot id ${snap.snapshotId}`)
    await sbx.files.write('state.txt', 'after')
    const fromSnap = await Sandbox.create(snap.snapshotId)
    try {
      assert.equal(await fromSnap.files.read('state.txt'), 'before')
    } finally {
      await fromSnap.kill()
    }
    const forks = await sbx.fork({ count: 1 })
    assert.equal(forks.length, 1)
    assert.ok(forks[0] instanceof Sandbox, `fork: ${describe(forks[0])}`)
    try {
      assert.equal(await forks[0].files.read('state.txt'), 'after')
      assert.notEqual(forks[0].sandboxId, sbx.sandboxId)
    } finally {
      await forks[0].kill()
    }
    const listed = await Sandbox.listSnapshots({ sandboxId: sbx.sandboxId }).nextItems()
    assert.ok(listed.some((s) => s.snapshotId === snap.snapshotId), JSON.stringify(listed))
    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), false)
    const m = await sbx.getMetrics()
    assert.ok(m.length === 1 && m[0].memUsed > 0 && m[0].memTotal > 0 && m[0].cpuCount > 0, JSON.stringify(m))
  }))

await check('lifecycle: a list goes on page by page, even when the last one listed is killed', async () => {
  const tag = randomBytes(6).toString('hex')
  const made = await Promise.all([0, 1, 2].map(() => Sandbox.create(template, { metadata: { pages: tag } })))
  try {
    const pager = Sandbox.list({ query: { metadata: { pages: tag } }, limit: 1 })
    const seen = []
    while (pager.hasNext) {
      const items = await pager.nextItems()
      assert.ok(items.length <= 1, `a page of ${items.length}`)
      for (const it of items) {
        seen.push(it.sandboxId)
        if (seen.length === 1) await Sandbox.kill(it.sandboxId) // the page's token names it
      }
    }
    assert.equal(new Set(seen).size, 3, `listed ${seen}`)
  } finally {
    await Promise.all(made.map((s) => s.kill().catch(() => {})))
  }
})

await check('files: metadata written with a file comes back with it', () =>
  withSandbox({}, async (sbx) => {
    await sbx.files.write('meta.txt', 'm', { metadata: { author: 'nook', stage: 'draft' } })
    const info = await sbx.files.getInfo('meta.txt')
    assert.deepEqual(info.metadata, { author: 'nook', stage: 'draft' })
    const listed = (await sbx.files.list('.')).find((e) => e.name === 'meta.txt')
    assert.deepEqual(listed?.metadata, { author: 'nook', stage: 'draft' })
    const plain = await sbx.files.write('plain.txt', 'p')
    assert.ok(!(await sbx.files.getInfo('plain.txt')).metadata, 'a file written without metadata has none')
    assert.ok(plain)
  }))

await check('files: signed download and upload URLs, and an expired one', () =>
  withSandbox({}, async (sbx) => {
    await sbx.files.write('/tmp/signed.txt', 'signed content')
    const down = await sbx.downloadUrl('/tmp/signed.txt')
    assert.ok(new URL(down).searchParams.get('signature'), `no signature in ${down}`)
    const got = await fetch(down)
    assert.equal(got.status, 200, `download: ${got.status} ${await got.clone().text()}`)
    assert.equal(await got.text(), 'signed content')
    const up = await sbx.uploadUrl('/tmp/uploaded.txt')
    const form = new FormData()
    form.append('file', new Blob(['via url']), '/tmp/uploaded.txt')
    const put = await fetch(up, { method: 'POST', body: form })
    assert.equal(put.status, 200, `upload: ${put.status} ${await put.text()}`)
    assert.equal(await sbx.files.read('/tmp/uploaded.txt'), 'via url')
    // A signature for another path, or tampered with, is refused.
    const other = new URL(down)
    other.searchParams.set('path', '/etc/shadow')
    assert.equal((await fetch(other)).status, 401, 'a signature used for another path')
    const expired = await sbx.downloadUrl('/tmp/signed.txt', { useSignatureExpiration: 1 })
    await until(async () => (await fetch(expired)).status === 401, 10_000, 'a URL signed for 1 s expires')
    const body = await (await fetch(expired)).json()
    assert.deepEqual(body, { code: 401, message: 'signature is already expired' })
  }))

await check('ports: getHost(port) names the sandbox, and E2b-Sandbox-Port reaches a server in it', () =>
  withSandbox({}, async (sbx) => {
    await sbx.commands.run('mkdir -p /tmp/www && echo served > /tmp/www/index.html && cd /tmp/www && python3 -m http.server 8000', { background: true })
    assert.match(sbx.getHost(8000), new RegExp(`^8000-${sbx.sandboxId}\\.`))
    const get = () => fetch(`${sandboxUrl}/index.html`, { headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '8000' } })
    await until(async () => (await get()).status === 200, 20_000, 'the server in the sandbox answers through the edge')
    assert.equal((await (await get()).text()).trim(), 'served')
    const closed = await fetch(`${sandboxUrl}/`, { headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '9' } })
    assert.equal(closed.status, 502, 'a port nothing listens on')
    await sbx.pause()
    const paused = await get()
    assert.equal(paused.status, 502, 'a paused sandbox is not woken by its ports')
    assert.equal(await sbx.isRunning(), false)
  }))

}

const failed = results.filter((ok) => !ok).length
console.log(`1..${results.length}`)
console.log(`# ${results.length - failed} passed, ${failed} failed`)
process.exit(failed ? 1 : 0)
