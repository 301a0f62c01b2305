// control/handlers.cpp: JSON answers and the fields every body reads (see handlers.hpp).
#include "control/handlers.hpp"

#include "common/log.hpp"

namespace ferry::control {

int http_status(ferry_status_code_t code) {
  switch (code) {
    case FERRY_STATUS_INVALID_ARGUMENT:
    case FERRY_STATUS_CORRUPT_DATA:
    case FERRY_STATUS_INCOMPATIBLE:
      return 400;
    case FERRY_STATUS_NOT_FOUND:
      return 404;
    case FERRY_STATUS_FAILED_PRECONDITION:
    case FERRY_STATUS_ABORTED:
      return 409;
    case FERRY_STATUS_UNIMPLEMENTED:
      return 501;
    case FERRY_STATUS_PEER_FAILED:
      return 502;
    case FERRY_STATUS_TIMEOUT:
      return 504;
    case FERRY_STATUS_OUT_OF_MEMORY:
      return 507;
    case FERRY_STATUS_OK:
    case FERRY_STATUS_IO:
    case FERRY_STATUS_INTERNAL:
    case FERRY_STATUS_END_OF_STREAM:
      return 500;
  }
  return 500;
}

HttpResponse reply(int status, const json& body) {
  HttpResponse res;
  res.status = status;
  res.body = body.dump();
  return res;
}

// Every error answer, whatever produced it: {"success": false, "message", "code"}.
HttpResponse error_reply(int status, const std::string& code, const std::string& message) {
  return reply(status, json{{"success", false}, {"message", message}, {"code", code}});
}

HttpResponse reply_error(ferry_status_code_t code, const std::string& message) {
  return error_reply(http_status(code), status_name(code), message);
}

// Parses the request body as a JSON object; an empty body is an empty object.
json parse_body(const HttpRequest& req) {
  if (req.body.empty()) return json::object();
  json body = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) fail(FERRY_STATUS_INVALID_ARGUMENT, "request body is not valid JSON");
  if (!body.is_object()) fail(FERRY_STATUS_INVALID_ARGUMENT, "request body must be a JSON object");
  return body;
}

std::string required_string(const json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || !it->is_string() || it->get<std::string>().empty()) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "field '{}' (non-empty string) is required", key);
  }
  return it->get<std::string>();
}

// SGLang accepts the weight version as a string; numbers are accepted and stringified.
std::optional<std::string> optional_label(const json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_number_integer()) return std::to_string(it->get<long long>());
  fail(FERRY_STATUS_INVALID_ARGUMENT, "field '{}' must be a string", key);
}

std::vector<std::string> tags_field(const json& body) {
  auto it = body.find("tags");
  if (it == body.end() || it->is_null()) return {};
  if (!it->is_array())
    fail(FERRY_STATUS_INVALID_ARGUMENT, "field 'tags' must be a list of strings");
  std::vector<std::string> tags;
  for (const auto& t : *it) {
    if (!t.is_string())
      fail(FERRY_STATUS_INVALID_ARGUMENT, "field 'tags' must be a list of strings");
    tags.push_back(t.get<std::string>());
  }
  return tags;
}

json report_json(const receiver::UpdateReport& r) {
  return json{{"weight_version", r.version.label},
              {"version", r.version.number},
              {"bytes", r.bytes},
              {"tensors", r.tensors},
              {"buckets", r.buckets},
              {"seconds", r.seconds}};
}

}  // namespace ferry::control
