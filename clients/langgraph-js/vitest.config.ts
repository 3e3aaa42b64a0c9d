import { defineConfig } from "vitest/config";

// The validation suite of @langchain/langgraph-checkpoint-validation uses
// vitest's globals (describe, it, expect, beforeAll, ...).
export default defineConfig({
  test: {
    globals: true,
    include: ["test/**/*.test.ts"],
    globalSetup: ["test/global-setup.ts"],
    testTimeout: 60_000,
    hookTimeout: 60_000,
    // One file at a time: every test talks to the same daemon.
    fileParallelism: false,
  },
});
