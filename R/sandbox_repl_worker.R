# The R worker of mcp-sandbox-repl: the same worker protocol as
# python/sandbox_repl_worker.py (docs/worker-protocol.md), in R.
#
# Started as `Rscript -e BOOTSTRAP`: the bootstrap (src/repl/r.rs) reads this file from
# the request pipe (fd 3) up to the line `#<end of the sandbox-repl R worker>`, parses
# it and calls the function it defines with that connection. Requests are read from fd 3
# and events written to fd 4 (both reopened through /proc/self/fd); user output goes to
# fds 1/2 as R writes it (R flushes its console after every write).
#
# R is single-threaded: nothing reads fd 3 while a cell runs. The server therefore
# delivers an interrupt as SIGINT to this process first and then the `interrupt` request
# (docs/worker-protocol.md, "The R worker"). The worker's own code runs with interrupts
# suspended; user code runs under allowInterrupts() inside a tryCatch(interrupt = ...),
# so an interrupt ends the cell with status "interrupted" and the state is kept.
function(.in) {
  .out <- file("/proc/self/fd/4", open = "w", encoding = "UTF-8", raw = TRUE)
  w <- new.env(parent = emptyenv())
  w$cur <- NULL        # id of the running cell
  w$queue <- list()    # requests read while a cell waited for input
  w$warnings <- list()
  w$plotdir <- file.path(tempdir(), "sandbox-repl-plots")
  dir.create(w$plotdir, showWarnings = FALSE)

  json <- function(x) jsonlite::toJSON(x, auto_unbox = TRUE, null = "null", na = "null",
                                       digits = NA, json_verbatim = TRUE, force = TRUE)
  send <- function(ev) {
    writeLines(json(ev), .out, useBytes = TRUE)
    flush(.out)
  }
  flush_std <- function() {
    try(flush(stdout()), silent = TRUE)
    try(flush(stderr()), silent = TRUE)
  }
  # Ends a pending SIGINT that belongs to no cell (one that arrived after its cell
  # ended): the loop runs long enough for R's interrupt check to come round.
  clear_interrupt <- function() {
    tryCatch(allowInterrupts(for (i in 1:2100) NULL), interrupt = function(e) NULL)
  }
  read_request <- function() {
    if (length(w$queue)) {
      r <- w$queue[[1]]
      w$queue <- w$queue[-1]
      return(r)
    }
    line <- readLines(.in, n = 1L, warn = FALSE, encoding = "UTF-8")
    if (!length(line)) quit(save = "no", status = 0L, runLast = FALSE)
    jsonlite::fromJSON(line, simplifyVector = FALSE)
  }
  cut_middle <- function(text, limit) {
    n <- nchar(text, type = "chars")
    if (is.null(limit) || n <= limit) return(list(repr = text, chars = n, truncated = FALSE))
    head <- limit %/% 2L
    tail <- limit - head
    left <- n - head - tail
    list(repr = paste0(substr(text, 1L, head), "\n[... ", left, " characters left out ...]\n",
                       substr(text, n - tail + 1L, n)),
         chars = n, truncated = TRUE)
  }
  shown <- function(x) {
    out <- utils::capture.output(if (isS4(x)) methods::show(x) else print(x))
    paste(out, collapse = "\n")
  }

  # --- input bridging: readline(), readLines("stdin"), menu() -------------------------
  # The running cell waits for the server's `reply_op` for it (an input or an install):
  # an interrupt for the cell meanwhile raises R's interrupt condition, a shutdown ends
  # the worker, a stale reply (for a cell that ended) is dropped, and any other request
  # is queued for after the cell.
  await_reply <- function(reply_op) {
    repeat {
      line <- base_readLines(.in, n = 1L, warn = FALSE, encoding = "UTF-8")
      if (!length(line)) quit(save = "no", status = 0L, runLast = FALSE)
      req <- jsonlite::fromJSON(line, simplifyVector = FALSE)
      op <- req$op
      if (identical(op, reply_op) && identical(req$id, w$cur)) {
        return(req)
      } else if (identical(op, "interrupt")) {
        if (identical(req$id, w$cur)) {
          signalCondition(structure(class = c("interrupt", "condition"),
                                    list(message = "interrupted", call = NULL)))
        }
      } else if (identical(op, "shutdown")) {
        quit(save = "no", status = 0L, runLast = FALSE)
      } else if (!isTRUE(op %in% c("input_reply", "install_reply"))) {
        w$queue[[length(w$queue) + 1L]] <- req
      }
    }
  }
  ask <- function(prompt = "", secret = FALSE) {
    if (is.null(w$cur)) return(NULL)
    prompt <- paste(prompt, collapse = "")
    cat(prompt)
    flush_std()
    ev <- list(ev = "input_request", id = w$cur, prompt = enc2utf8(prompt))
    if (secret) ev$secret <- TRUE
    send(ev)
    req <- await_reply("input_reply")
    text <- req$text
    if (is.null(text)) return(NULL)
    cat(if (secret) "\n" else paste0(text, "\n"))
    text
  }
  is_stdin <- function(con) {
    if (is.character(con)) return(identical(con, "stdin"))
    if (inherits(con, "connection")) {
      d <- tryCatch(summary(con)$description, error = function(e) "")
      return(as.integer(con) == 0L || identical(d, "stdin"))
    }
    FALSE
  }
  base_readLines <- base::readLines
  my_readline <- function(prompt = "") {
    text <- ask(prompt)
    if (is.null(text)) "" else text
  }
  my_readLines <- function(con = stdin(), n = -1L, ok = TRUE, warn = TRUE,
                           encoding = "unknown", skipNul = FALSE) {
    if (!is_stdin(con)) {
      return(base_readLines(con, n = n, ok = ok, warn = warn, encoding = encoding,
                            skipNul = skipNul))
    }
    lines <- character()
    while (n < 0L || length(lines) < n) {
      text <- ask("")
      if (is.null(text)) break
      lines <- c(lines, text)
    }
    lines
  }
  my_menu <- function(choices, graphics = FALSE, title = NULL) {
    if (!is.null(title)) cat(title, "\n", sep = "")
    cat(paste0(seq_along(choices), ": ", choices), sep = "\n")
    repeat {
      text <- ask("Selection: ")
      if (is.null(text)) return(0L)
      i <- suppressWarnings(as.integer(trimws(text)))
      if (!is.na(i) && i >= 0L && i <= length(choices)) return(i)
      cat("Enter an item from the menu, or 0 to exit\n")
    }
  }
  replace_in <- function(env, name, f) {
    locked <- bindingIsLocked(name, env)
    if (locked) unlockBinding(name, env)
    assign(name, f, envir = env)
    if (locked) lockBinding(name, env)
  }
  environment(my_readline) <- environment(my_readLines) <- environment(my_menu) <- environment()
  replace_in(baseenv(), "readline", my_readline)
  replace_in(baseenv(), "readLines", my_readLines)
  # install.packages() asks the server to install (`install_request`) and waits for its
  # `install_reply`, as readline() waits for input: the server's installer, not this
  # process, reaches the repository (through the network broker) and writes the session
  # library, which is on .libPaths() already, so library() loads the packages at once.
  my_install <- function(pkgs, lib, repos = getOption("repos"), ...) {
    if (is.null(w$cur)) stop("install.packages() runs only in a cell of this session", call. = FALSE)
    pkgs <- unique(as.character(pkgs))
    if (!length(pkgs)) stop("install.packages(): name at least one package", call. = FALSE)
    if (!missing(lib) || !missing(repos) || length(list(...))) {
      message("install.packages(): the server installs into the session library from its ",
              "configured repository; lib, repos and other arguments are not used")
    }
    flush_std()
    send(list(ev = "install_request", id = w$cur, packages = I(pkgs)))
    req <- await_reply("install_reply")
    if (!isTRUE(req$ok)) stop(req$message, call. = FALSE)
    message(req$message)
    invisible(NULL)
  }
  replace_in(asNamespace("utils"), "install.packages", my_install)
  if ("package:utils" %in% search()) replace_in(as.environment("package:utils"), "install.packages", my_install)
  replace_in(asNamespace("utils"), "menu", my_menu)
  if ("package:utils" %in% search()) replace_in(as.environment("package:utils"), "menu", my_menu)

  # --- help and plots -----------------------------------------------------------------
  options(
    help_type = "text",
    pager = function(files, header, title, delete.file) {
      for (f in files) {
        text <- base_readLines(f, warn = FALSE)
        cat(gsub(".\b", "", text, useBytes = TRUE), sep = "\n")
        if (isTRUE(delete.file)) unlink(f)
      }
    },
    browser = function(url, ...) cat("(not opened in a browser:", url, ")\n"),
    device = function(...) {
      grDevices::png(file.path(w$plotdir, sprintf("cell%s-%%03d.png", w$cell)),
                     width = 7, height = 5, units = "in", res = 96, type = "cairo")
    },
    warn = 0,
    # askpass::askpass() (and what calls it: git2r, httr, ...) asks through this hook.
    askpass = function(prompt = "Password: ", ...) {
      text <- ask(prompt, secret = TRUE)
      if (is.null(text)) NULL else text
    }
  )
  collect_plots <- function() {
    if (grDevices::dev.cur() > 1L) try(grDevices::graphics.off(), silent = TRUE)
    files <- sort(list.files(w$plotdir, full.names = TRUE))
    items <- lapply(files, function(f) {
      size <- file.info(f)$size
      data <- if (is.na(size) || size == 0) NULL else readBin(f, "raw", size)
      unlink(f)
      if (is.null(data)) NULL else list(mime = "image/png", data = gsub("\n", "", jsonlite::base64_enc(data), fixed = TRUE))
    })
    Filter(Negate(is.null), items)
  }

  # --- running a cell ------------------------------------------------------------------
  user_names <- function() ls(globalenv())
  # A variable's value; an active binding that fails is NULL, not the worker's end.
  value_of <- function(nm) tryCatch(get(nm, envir = globalenv()), error = function(e) NULL)
  # The call of a condition raised by the cell's top level is the worker's eval: none.
  call_of <- function(cond) {
    call <- conditionCall(cond)
    if (identical(call, quote(eval(e, globalenv())))) NULL else call
  }
  warning_text <- function(ws) {
    one <- function(wn) {
      call <- call_of(wn)
      msg <- conditionMessage(wn)
      if (is.null(call)) msg else paste0("In ", paste(deparse(call, nlines = 1L), collapse = ""),
                                         " : ", msg)
    }
    if (length(ws) == 1L) return(paste0("Warning message:\n", one(ws[[1]]), "\n"))
    paste0("Warning messages:\n",
           paste0(seq_along(ws), ": ", vapply(ws, one, ""), collapse = "\n"), "\n")
  }
  describe_error <- function(e, calls) {
    call <- call_of(e)
    msg <- conditionMessage(e)
    head <- if (is.null(call)) paste0("Error: ", msg)
            else paste0("Error in ", paste(deparse(call, nlines = 1L), collapse = ""), " : ", msg)
    names <- vapply(calls, function(c) {
      f <- c[[1]]
      if (is.name(f)) as.character(f) else paste(deparse(f, nlines = 1L), collapse = "")
    }, "")
    tb <- if (length(names)) paste0(head, "\nCalls: ", paste(names, collapse = " -> ")) else head
    list(ename = class(e)[1], evalue = msg, traceback = tb)
  }
  # The frames of user code at an error: those below the worker's eval, without the
  # condition machinery on top.
  user_calls <- function(calls) {
    marks <- which(vapply(calls, function(c) identical(c[[1]], quote(.sandbox_repl_eval)), NA))
    if (length(marks)) calls <- calls[-seq_len(max(marks))]
    while (length(calls) && identical(calls[[1]], quote(eval(e, globalenv())))) calls <- calls[-1]
    stops <- which(vapply(calls, function(c) {
      f <- c[[1]]
      is.name(f) && as.character(f) %in% c("stop", ".handleSimpleError", "h", "warning",
                                            "signalCondition", "withCallingHandlers")
    }, NA))
    if (length(stops)) calls <- calls[seq_len(min(stops) - 1L)]
    calls
  }
  .sandbox_repl_eval <- function(e) eval(e, globalenv())
  run_exprs <- function(exprs) {
    value <- NULL
    has_value <- FALSE
    n <- length(exprs)
    for (i in seq_len(n)) {
      v <- withVisible(.sandbox_repl_eval(exprs[[i]]))
      if (v$visible) {
        if (i == n) {
          value <- shown(v$value)
          has_value <- TRUE
        } else if (isS4(v$value)) methods::show(v$value) else print(v$value)
      }
    }
    if (has_value && nzchar(value)) value else NULL
  }
  run_cell <- function(req, exprs_of) {
    w$cur <- req$id
    w$cell <- req$cell
    w$warnings <- list()
    before <- sapply(user_names(), value_of, simplify = FALSE)
    status <- "ok"
    error <- NULL
    value <- NULL
    calls <- NULL
    value <- tryCatch(
      allowInterrupts(withCallingHandlers(
        run_exprs(exprs_of()),
        warning = function(wn) {
          w$warnings[[length(w$warnings) + 1L]] <- wn
          invokeRestart("muffleWarning")
        },
        error = function(e) calls <<- user_calls(sys.calls())
      )),
      interrupt = function(i) {
        status <<- "interrupted"
        error <<- list(ename = "interrupt", evalue = "",
                       traceback = "Interrupted (the cell got R's interrupt condition; the session's state is kept)")
        NULL
      },
      error = function(e) {
        status <<- "error"
        error <<- describe_error(e, if (is.null(calls)) list() else calls)
        NULL
      }
    )
    if (status == "interrupted") clear_interrupt()
    w$cur <- NULL
    if (length(w$warnings)) cat(warning_text(w$warnings), file = stderr())
    display <- collect_plots()
    flush_std()
    after <- user_names()
    changed <- Filter(function(nm) {
      !(nm %in% names(before)) || !identical(before[[nm]], value_of(nm))
    }, after)
    done <- list(ev = "done", id = req$id, status = status, display = display)
    if (length(changed)) done$new_variables <- I(utils::head(changed, 100L))
    if (!is.null(error)) done$error <- error
    if (!is.null(value)) done$value <- cut_middle(enc2utf8(value), req$repr_limit)
    send(done)
  }
  run_file <- function(req) {
    path <- req$path
    argv <- unlist(req$argv)
    if (is.null(argv)) argv <- character()
    saved <- base::commandArgs
    replace_in(baseenv(), "commandArgs", function(trailingOnly = FALSE) {
      if (trailingOnly) argv else c(file.path(R.home("bin"), "R"), "--no-echo",
                                    paste0("--file=", path), "--args", argv)
    })
    on.exit(replace_in(baseenv(), "commandArgs", saved))
    run_cell(req, function() parse(file = path, keep.source = FALSE, encoding = "UTF-8"))
  }

  # --- variables -------------------------------------------------------------------------
  type_of <- function(x) class(x)[1]
  short <- function(x) {
    s <- tryCatch(utils::capture.output(utils::str(x, max.level = 0L, give.attr = FALSE,
                                                    vec.len = 3L))[1],
                  error = function(e) "<unprintable>")
    s <- trimws(gsub("\\s+", " ", if (is.na(s)) "" else s))
    if (nchar(s) > 120L) paste0(substr(s, 1L, 117L), "...") else s
  }
  size_of <- function(x) tryCatch(as.numeric(utils::object.size(x)), error = function(e) NULL)
  list_variables <- function(req) {
    names <- sort(user_names())
    total <- length(names)
    if (!is.null(req$start)) names <- names[names >= req$start]
    limit <- min(if (is.null(req$limit)) 5000L else as.integer(req$limit), 5000L)
    rest <- if (length(names) > limit) names[-seq_len(limit)] else character()
    names <- utils::head(names, limit)
    vars <- lapply(names, function(nm) {
      x <- value_of(nm)
      list(name = nm, type = type_of(x), repr = short(x), size = size_of(x))
    })
    send(list(ev = "variables", id = req$id, variables = I(vars), omitted = length(rest),
              `next` = if (length(rest)) rest[1] else NULL, total = total))
  }
  get_variable <- function(req) {
    nm <- req$name
    if (!exists(nm, envir = globalenv(), inherits = FALSE)) {
      return(send(list(ev = "failed", id = req$id,
                       message = paste0("Error: object '", nm, "' not found"))))
    }
    x <- get(nm, envir = globalenv())
    text <- tryCatch(shown(x), error = function(e) paste("<print failed:", conditionMessage(e), ">"))
    cut <- cut_middle(enc2utf8(text), req$repr_limit)
    j <- tryCatch(if (is.function(x) || is.environment(x)) NULL else json(x),
                  error = function(e) NULL)
    send(list(ev = "variable", id = req$id, name = nm, type = type_of(x), repr = cut$repr,
              chars = cut$chars, truncated = cut$truncated, size = size_of(x),
              json = j, has_json = !is.null(j)))
  }
  set_variable <- function(req) {
    v <- tryCatch(jsonlite::fromJSON(json(req$value), simplifyVector = TRUE),
                  error = function(e) e)
    if (inherits(v, "error")) {
      return(send(list(ev = "failed", id = req$id, message = conditionMessage(v))))
    }
    if (!nzchar(req$name) || make.names(req$name) != req$name) {
      return(send(list(ev = "failed", id = req$id,
                       message = paste0("'", req$name, "' is not a syntactic R name"))))
    }
    assign(req$name, v, envir = globalenv())
    send(list(ev = "ok", id = req$id))
  }
  delete_variable <- function(req) {
    if (!exists(req$name, envir = globalenv(), inherits = FALSE)) {
      return(send(list(ev = "failed", id = req$id,
                       message = paste0("Error: object '", req$name, "' not found"))))
    }
    rm(list = req$name, envir = globalenv())
    send(list(ev = "ok", id = req$id))
  }

  # --- the loop ---------------------------------------------------------------------------
  send(list(ev = "ready", protocol = 1L, pid = Sys.getpid(),
            version = paste(R.version$major, R.version$minor, sep = "."),
            executable = file.path(R.home("bin"), "R")))
  # One request; a failure of the worker's own code answers it in words instead of
  # ending the worker (a cell's `done`, or `failed`).
  handle <- function(req) {
    op <- req$op
    if (identical(op, "execute")) {
      code <- req$code
      run_cell(req, function() parse(text = code, keep.source = FALSE, encoding = "UTF-8"))
    } else if (identical(op, "run_file")) {
      run_file(req)
    } else if (identical(op, "interrupt")) {
      clear_interrupt() # its cell has ended: the SIGINT sent with it interrupts nothing
    } else if (identical(op, "list_variables")) {
      list_variables(req)
    } else if (identical(op, "get_variable")) {
      get_variable(req)
    } else if (identical(op, "set_variable")) {
      set_variable(req)
    } else if (identical(op, "delete_variable")) {
      delete_variable(req)
    } else if (identical(op, "clear_variables")) {
      rm(list = ls(globalenv(), all.names = TRUE), envir = globalenv())
      send(list(ev = "ok", id = req$id))
    } else if (identical(op, "add_site_dirs")) {
      dirs <- unlist(req$dirs)
      missing <- dirs[!dir.exists(dirs)]
      .libPaths(c(dirs[dir.exists(dirs)], .libPaths()))
      if (length(missing)) {
        send(list(ev = "failed", id = req$id,
                  message = paste("no such directory:", paste(missing, collapse = ", "))))
      } else send(list(ev = "ok", id = req$id))
    } else if (identical(op, "ping")) {
      send(list(ev = "ok", id = req$id))
    } else if (identical(op, "shutdown")) {
      quit(save = "no", status = 0L, runLast = FALSE)
    } else if (!is.null(req$id) && !isTRUE(op %in% c("input_reply", "install_reply"))) {
      send(list(ev = "failed", id = req$id, message = paste("unknown request", op)))
    }
  }
  repeat {
    req <- read_request()
    tryCatch(handle(req), error = function(e) {
      w$cur <- NULL
      msg <- paste("the R worker failed:", conditionMessage(e))
      if (isTRUE(req$op %in% c("execute", "run_file"))) {
        send(list(ev = "done", id = req$id, status = "error", display = list(),
                  error = list(ename = "worker error", evalue = msg, traceback = msg)))
      } else if (!is.null(req$id)) send(list(ev = "failed", id = req$id, message = msg))
    })
  }
}
#<end of the sandbox-repl R worker>
