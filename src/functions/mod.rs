//! Azure Functions custom-handler protocol (invocation payloads and routes).
