/**
 * LangGraph's official checkpointer validation suite
 * (@langchain/langgraph-checkpoint-validation) against a real daemon, in
 * full: put, putWrites, getTuple, list and deleteThread (`validate`), plus the
 * opt-in getDeltaChannelHistory scenarios that the in-repo savers run too.
 */
import { deltaChannelHistoryTests, validate } from "@langchain/langgraph-checkpoint-validation";
import { initializer } from "./initializer.js";

validate(initializer);
deltaChannelHistoryTests(initializer);
